# Shared helpers for integration tests (sourced, not run). Each test gets a private scratch
# directory in $WORK and a private ledger in $TANDEM_LEDGER_DIR, removed at exit.
WORK=$(mktemp -d /tmp/tandem-it-XXXXXX)
export TANDEM_LEDGER_DIR="$WORK/ledger"
FAILURES=0
cleanup_work() { release_ports; rm -rf "$WORK"; }
trap cleanup_work EXIT

fail() { echo "FAIL: $*" >&2; FAILURES=$((FAILURES + 1)); }

# expect_exit CODE CMD...: runs CMD with output to $WORK/last.out/.err and checks its exit code.
expect_exit() {
    local want=$1; shift
    "$@" >"$WORK/last.out" 2>"$WORK/last.err"
    local got=$?
    if [ "$got" -ne "$want" ]; then
        fail "expected exit $want, got $got: $*"
        sed 's/^/  stderr: /' "$WORK/last.err" >&2
    fi
}

finish() {
    if [ "$FAILURES" -ne 0 ]; then echo "$FAILURES failure(s)" >&2; exit 1; fi
    echo "ok"; exit 0
}

# One simulated 10 GB GPU unless the test sets its own.
export TANDEM_FAKE_GPUS=${TANDEM_FAKE_GPUS-"uuid=GPU-sim-0,name=Sim 10G,total_mb=10000,memory=discrete"}
# Waiters re-check often; status/monitor loops are fast so tests stay short.
export TANDEM_MONITOR_MS=${TANDEM_MONITOR_MS-200}

# wait_until SECONDS CMD...: polls CMD every 50 ms until it succeeds; fails the test on timeout.
# The limit is scaled by TANDEM_TEST_WAIT_SCALE (default 3): the limits were set on the 2-core
# development VM, and CI's 2-core machine ran the suite 2.4x slower there (ctest 698 s against
# 286 s, 2026-12-07), which made a 30 s wait time out. A limit only bounds how long a failing
# test waits; no test waits for something expected not to happen.
wait_until() {
    local limit=$(( $1 * ${TANDEM_TEST_WAIT_SCALE:-3} )); shift
    local deadline=$(( $(date +%s%N) + limit * 1000000000 ))
    until "$@" >/dev/null 2>&1; do
        if [ "$(date +%s%N)" -gt "$deadline" ]; then fail "timed out after ${limit}s waiting for: $*"; return 1; fi
        sleep 0.05
    done
}

# kill9_when PATH CMD...: runs CMD in the background (output to $WORK/killed.log), waits until PATH
# exists (e.g. a checkpoint directory), then kills it with SIGKILL, as a crash would. CMD may be a
# shell function: it runs as a job of its own process group, and the whole group is killed (not
# only the subshell, whose child would go on running). Prints a note when CMD had already
# finished (the caller's --resume then simply has nothing left to do).
kill9_when() {
    local path=$1; shift
    set -m
    "$@" >"$WORK/killed.log" 2>&1 &
    local pid=$!
    set +m
    wait_until 60 test -e "$path"
    if ! kill -9 -- -"$pid" 2>/dev/null; then echo "note: $1 finished before the kill"; fi
    wait "$pid" 2>/dev/null
}

# same_run REF RUN WHAT ADAPTER...: every ADAPTER's adapter_model.safetensors byte-identical in the
# two runs' output folders and the same logged [step, loss, val_loss] in their metrics.jsonl;
# otherwise fails with "RUN/ADAPTER: WHAT".
same_run() {
    local ref=$1 run=$2 what=$3; shift 3
    for a in "$@"; do
        cmp -s "$ref/$a/adapter_model.safetensors" "$run/$a/adapter_model.safetensors" || fail "$run/$a: $what"
        diff <(jq -c '[.step, .loss, .val_loss]' "$ref/$a/metrics.jsonl") \
             <(jq -c '[.step, .loss, .val_loss]' "$run/$a/metrics.jsonl") >/dev/null ||
            fail "$run/$a: $what (logged losses)"
    done
}

# ledger_count: reservations + queued tickets in the ledger (via gpu status --json).
ledger_count() {
    "$TANDEM" gpu status --json | jq '[.gpus[] | (.reservations | length) + (.queue | length)] | add // 0'
}

# free_port: prints a loopback TCP port nothing listens on, claimed for this test until it exits.
# Tests run in parallel and their daemons (sshd, slurmctld, slurmd) bind the port later, so a
# port is (1) claimed under $PORT_CLAIMS (a directory holding the claiming test's pid, made while
# holding $PORT_CLAIMS/.lock; a claim whose test is gone is taken over), so two tests never pick
# the same one, and (2) taken below the kernel's ephemeral range (ip_local_port_range), so no
# outgoing connection's local port can occupy it between this check and the daemon's bind (a CI
# failure of 2026-12-06: slurmd "Unable to bind listen port: Address already in use").
PORT_CLAIMS=/tmp/tandem-port-claims
free_port() {
    local lo hi p base=10000 span owner
    read -r lo hi </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || lo=32768
    span=$(( lo - base ))
    if [ "$span" -lt 2000 ]; then base=$(( hi + 1 )); span=$(( 65535 - hi )); fi
    # an ephemeral range that leaves neither side: any port, claims still keep tests apart
    if [ "$span" -lt 2000 ]; then base=10000; span=55535; fi
    mkdir -p "$PORT_CLAIMS" 2>/dev/null && chmod 1777 "$PORT_CLAIMS" 2>/dev/null
    : >>"$PORT_CLAIMS/.lock" && chmod 666 "$PORT_CLAIMS/.lock" 2>/dev/null
    {
        flock 9
        for _ in $(seq 1 200); do
            p=$(( base + (RANDOM * 32768 + RANDOM) % span ))
            owner=$(cat "$PORT_CLAIMS/$p/pid" 2>/dev/null)
            [ -n "$owner" ] && [ -d "/proc/$owner" ] && continue # claimed by a live test
            (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && continue # something listens
            rm -rf "${PORT_CLAIMS:?}/$p"
            mkdir "$PORT_CLAIMS/$p" && echo "$$" >"$PORT_CLAIMS/$p/pid" || continue
            echo "$p" >>"$WORK/.ports"
            echo "$p"
            return 0
        done
        return 1
    } 9>>"$PORT_CLAIMS/.lock"
}
release_ports() {
    local p
    [ -r "$WORK/.ports" ] || return 0
    while read -r p; do rm -rf "${PORT_CLAIMS:?}/$p"; done <"$WORK/.ports"
}

# close_adapters A B: the two adapter_model.safetensors agree within unit.trainer's fused ==
# alone bound (max |a - b| / (1e-3 + max |b|) < 1e-3), tensor by tensor (co-training tests)
close_adapters() {
    python3 - "$1/adapter_model.safetensors" "$2/adapter_model.safetensors" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        assert v["dtype"] == "F32", v["dtype"]
        s, e = v["data_offsets"]
        out[k] = struct.unpack("<%df" % ((e - s) // 4), b[8 + n + s:8 + n + e])
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys(), "different tensors"
md = max(abs(x - y) for k in a for x, y in zip(a[k], b[k]))
mx = max(abs(y) for k in b for y in b[k])
print("max rel diff %.3g" % (md / (1e-3 + mx)))
sys.exit(0 if md / (1e-3 + mx) < 1e-3 else 1)
PY
}

# try_hold_host PID [LEDGER_DIR]: stops a co-training host (SIGSTOP) once it advertises in
# LEDGER_DIR (default $TANDEM_LEDGER_DIR) and no longer holds the election lock; returns 1 when
# the host ended first. hold_host: the same, and an ended host fails the test. release_host PID
# ERR...: once every joiner whose stderr is an ERR file waits for the stopped host
# (waiting_for_host: its join is sent, docs/co-training.md), continues it, and the host admits
# them all at its next step boundary. Why: a host of a few tiny-model steps can finish before a
# finetune started after it has loaded, so "joins the running host" would race the CPU's speed.
try_hold_host() {
    local pid=$1 dir=${2:-$TANDEM_LEDGER_DIR}
    local deadline=$(( $(date +%s) + 60 ))
    while [ "$(date +%s)" -lt "$deadline" ]; do
        kill -0 "$pid" 2>/dev/null || return 1
        if [ -e "$dir/cotrain-$pid.json" ] && kill -STOP "$pid" 2>/dev/null; then
            flock -n "$dir/cotrain.lock" true && return 0 # stopped outside an election
            kill -CONT "$pid"
        fi
        sleep 0.01
    done
    fail "could not hold host $pid in 60 s (no advertisement, or the election lock stayed held)"
    return 1
}
hold_host() { try_hold_host "$@" || { fail "host $1 ended before it was held"; return 1; }; }
waiting_for_host() { grep -q "pid $1 has sent nothing .* waiting for it" "$2"; }
release_host() {
    local pid=$1 f
    shift
    for f in "$@"; do
        wait_until 30 waiting_for_host "$pid" "$f" || sed 's/^/  joiner: /' "$f" >&2
    done
    kill -CONT "$pid"
}

# last_step FILE: the step of the last progress line ("... step S/T ...") in FILE (empty: none);
# step_at_least FILE N: whether it is >= N (for wait_until); last_checkpoint DIR: the highest
# N of DIR/checkpoint-N (empty: none).
last_step() { sed -n 's/.* step \([0-9]*\)\/[0-9]* .*/\1/p' "$1" | tail -1; }
step_at_least() { local s; s=$(last_step "$1"); [ -n "$s" ] && [ "$s" -ge "$2" ]; }
last_checkpoint() { ls "$1" | sed -n 's/^checkpoint-\([0-9]*\)$/\1/p' | sort -n | tail -1; }

# word_samples FILE COUNT WORDS [SEED]: COUNT JSON lines {"text": ...} of WORDS random words of
# 2-6 letters from a-h (about 4.5 tokens a word with the built-in byte-level tokenizer: 60 words
# make a ~250-token sample), the same for the same SEED (default 1).
word_samples() {
    python3 - "$@" <<'PY'
import json, random, sys
path, count, words = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 1)
def text(n): return " ".join("".join(r.choice("abcdefgh") for _ in range(r.randint(2, 6))) for _ in range(n))
with open(path, "w") as f:
    for _ in range(count): f.write(json.dumps({"text": text(words)}) + "\n")
PY
}

# three_adapters LINES: the tiny model ($WORK/model), data a, b (varied lines) and c (nearly one
# repeated line: the clear winner at its high learning rate) of LINES lines each, and
# $WORK/adapters.toml training them as labels a, b, c into out/a, out/b, out/c (the cluster tests'
# three-adapter submission).
three_adapters() {
    local lines=$1 n i
    "$TANDEM" init-model "$WORK/model" --preset tiny --seed 1 >/dev/null || fail "init-model"
    mkdir -p "$WORK/data"
    for n in a b; do
        for i in $(seq 1 "$lines"); do
            printf '{"text": "%s %d %s %d varied words %d"}\n' "$n" "$i" "$n" $((i * 7)) $((i * 13 % 11))
        done >"$WORK/data/$n.jsonl"
    done
    # Distinct lines (identical ones would all hash into the training split, leaving no validation).
    for i in $(seq 1 "$lines"); do printf '{"text": "c c c c c c c c c c c c c c c c %d"}\n' "$i"; done >"$WORK/data/c.jsonl"
    {
        printf 'epochs = 2\nmax_seq_len = 32\nbatch_size = 4\n'
        for n in a b c; do
            printf '[[adapter]]\ndata = "data/%s.jsonl"\noutput = "out/%s"\nlabel = "%s"\n' "$n" "$n" "$n"
            [ "$n" = c ] && echo "learning_rate = 1e-2" || echo "learning_rate = 1e-6"
        done
    } >"$WORK/adapters.toml"
}
