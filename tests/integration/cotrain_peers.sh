#!/bin/bash
# Co-training groundwork between separately started programs (tests/lib/cotrain_peer.c), on real
# models written by `tandem init-model`: a joiner finds the host and is served; another model,
# method or device finds no host; the host's death (kill -9, SIGSTOP) is noticed within a second;
# a dead host's files are removed by the next discovery; a clean stop removes its own; as root,
# real users made with useradd: an outsider is refused, a member of the ledger directory's group
# joins (setgid, group-writable directory).
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
PEER="$TANDEM_BINARY_DIR/tests/cotrain_peer"
[ -x "$PEER" ] || { echo "skip: $PEER not built"; exit 77; }
L="$TANDEM_LEDGER_DIR"
mkdir -p "$L" && chmod 700 "$L"
cd "$WORK" # joiners name their data relative to the working directory

expect_exit 0 "$TANDEM" init-model "$WORK/m1" --preset tiny --seed 1
expect_exit 0 "$TANDEM" init-model "$WORK/m2" --preset tiny --seed 2
cp -r "$WORK/m1" "$WORK/m1-copy"

# start_host NAME ARGS...: a host in the background (output $WORK/NAME.out), waits for "host PID"
# with its own pid: a reused NAME.out still holds the previous host's line until the new process
# truncates it, and a joiner started on that line would find no host.
start_host() {
    local name=$1; shift
    "$PEER" host "$@" >"$WORK/$name.out" 2>&1 &
    local pid=$!
    eval "${name}_pid=$pid"
    wait_until 10 grep -qx "host $pid" "$WORK/$name.out"
}

# 1. Join: a copy of the model at another path has the same identity; the joiner gets its
#    adapter's progress and done; the host saw the join.
start_host h1 "$L" "$WORK/m1"
expect_exit 0 "$PEER" join "$L" "$WORK/m1-copy"
grep -q '^admitted 1$' "$WORK/last.out" || fail "join: no admitted line"
grep -q '^progress 0 1$' "$WORK/last.out" || fail "join: no progress line"
grep -q '^done 0 finished$' "$WORK/last.out" || fail "join: no done line"
grep -q '^joined pid [0-9]* user .* adapters 1$' "$WORK/h1.out" || fail "host did not log the join"
# A second host of the same identity is not started: the election finds the first.
expect_exit 3 "$PEER" host "$L" "$WORK/m1"
grep -q "^exists $h1_pid$" "$WORK/last.out" || fail "second host: $(cat "$WORK/last.out")"

# 2. Incompatible: another model (other weights, same config), method, device: no host.
expect_exit 3 "$PEER" join "$L" "$WORK/m2"
grep -q '^no host: model$' "$WORK/last.out" || fail "other model: $(cat "$WORK/last.out")"
expect_exit 3 "$PEER" join "$L" "$WORK/m1" --method lora
grep -q '^no host: method$' "$WORK/last.out" || fail "other method: $(cat "$WORK/last.out")"
expect_exit 3 "$PEER" join "$L" "$WORK/m1" --device cpu
grep -q '^no host: device$' "$WORK/last.out" || fail "other device: $(cat "$WORK/last.out")"

# 3. A clean stop (SIGTERM) removes the host's files.
kill -TERM "$h1_pid"; wait "$h1_pid"
grep -q '^stopped$' "$WORK/h1.out" || fail "host did not stop cleanly"
ls "$L"/cotrain-*.json "$L"/cotrain-*.sock >/dev/null 2>&1 && fail "files left after a clean stop"

# 4. Host death while a joiner is attached: kill -9 (EOF) and SIGSTOP (silence).
for how in KILL STOP; do
    start_host h2 "$L" "$WORK/m1" --hold
    rm -f "$WORK/j.out" # the last round's "admitted 1" must not satisfy this round's wait
    ("$PEER" join "$L" "$WORK/m1" >"$WORK/j.out" 2>&1; echo "exit $?" >>"$WORK/j.out") &
    jpid=$!
    wait_until 10 grep -q '^admitted 1$' "$WORK/j.out"
    sleep 1.2 # attached and quiet: heartbeats keep it there
    grep -q '^gone' "$WORK/j.out" && fail "$how: joiner gave up on a live host"
    t_kill=$(date +%s%N)
    kill -"$how" "$h2_pid"
    wait "$jpid"
    grep -q '^exit 11$' "$WORK/j.out" || fail "$how: joiner: $(cat "$WORK/j.out")"
    read -r _ kind t_seen < <(grep '^gone' "$WORK/j.out")
    ms=$(( (t_seen - t_kill) / 1000000 ))
    echo "host $how noticed by the joiner: $kind, $ms ms after the signal"
    if [ "$how" = KILL ]; then
        [ "$kind" = eof ] && [ "$ms" -le 1000 ] || fail "kill -9: $kind $ms ms"
    else
        # silence is declared 1000 ms after the last heartbeat, which came before the signal
        [ "$kind" = silence ] && [ "$ms" -le 1100 ] || fail "SIGSTOP: $kind $ms ms"
    fi
    kill -KILL "$h2_pid" 2>/dev/null; wait "$h2_pid" 2>/dev/null
    # The dead host's files stay until a discovery removes them.
    [ -e "$L/cotrain-$h2_pid.json" ] || fail "$how: advertisement vanished before discovery"
    expect_exit 0 "$PEER" list "$L"
    [ -s "$WORK/last.out" ] && fail "$how: dead host listed"
    [ -e "$L/cotrain-$h2_pid.json" ] || [ -e "$L/cotrain-$h2_pid.sock" ] && fail "$how: stale files kept"
done

# 5. Other users (root only): real accounts made with useradd.
if [ "$(id -u)" -ne 0 ]; then
    echo "skip part 5: needs root to create users (useradd) and run a joiner as them (runuser)"
    finish
fi
for t in useradd groupadd userdel groupdel runuser; do
    command -v $t >/dev/null || { echo "skip part 5: $t missing"; finish; }
done
SUFFIX=$$
GRP="tdmct$SUFFIX"; MEMBER="tdmctm$SUFFIX"; OUTSIDER="tdmcto$SUFFIX"
cleanup_users() {
    userdel "$MEMBER" 2>/dev/null; userdel "$OUTSIDER" 2>/dev/null; groupdel "$GRP" 2>/dev/null
    cleanup_work
}
trap cleanup_users EXIT
groupadd "$GRP" && useradd -M -N -g nogroup -G "$GRP" "$MEMBER" && useradd -M -N -g nogroup "$OUTSIDER" ||
    { fail "cannot create test users"; finish; }
# Everything the joiners read must be theirs to read: a world-traversable tree.
SH=$(mktemp -d /tmp/tdm-cotrain-shared-XXXXXX)
trap 'cleanup_users; rm -rf "$SH"' EXIT
chmod 711 "$SH"; cp -r "$WORK/m1" "$SH/model"; chmod -R a+rX "$SH/model"
# the checkout may sit where other users cannot enter (root's home, a 0700 mktemp -d): the other
# users run a copy of the peer program from the shared tree
mkdir "$SH/bin"; cp "$PEER" "$SH/bin/"; chmod -R a+rX "$SH/bin"; PEER="$SH/bin/cotrain_peer"
mkdir "$SH/ledger"; chgrp "$GRP" "$SH/ledger"; chmod 2771 "$SH/ledger"
start_host h3 "$SH/ledger" "$SH/model" --hold
sock="$SH/ledger/cotrain-$h3_pid.sock"
[ "$(stat -c %a:%G "$sock")" = "660:$GRP" ] || fail "shared socket: $(stat -c %a:%G "$sock")"
[ "$(stat -c %a "$SH/ledger/cotrain-$h3_pid.json")" = 640 ] || fail "shared advertisement mode"
as() { local u=$1; shift; (cd /tmp && runuser -u "$u" -- "$@"); }
# A member (supplementary group) joins: its adapter is admitted.
as "$MEMBER" "$PEER" join "$SH/ledger" "$SH/model" >"$WORK/member.out" 2>&1 &
mpid=$!
wait_until 10 grep -q '^admitted 1$' "$WORK/member.out"
grep -q "^joined pid [0-9]* user $MEMBER adapters 1$" "$WORK/h3.out" || fail "member join not logged"
# The outsider cannot list the shared directory, so it finds no host...
expect_exit 1 as "$OUTSIDER" "$PEER" join "$SH/ledger" "$SH/model"
grep -q 'Permission denied' "$WORK/last.err" || fail "outsider listing: $(cat "$WORK/last.err")"
# ...cannot connect to a socket whose name it guessed (0660)...
expect_exit 12 as "$OUTSIDER" "$PEER" join "$SH/ledger" "$SH/model" --socket "$sock"
grep -q 'Permission denied' "$WORK/last.out" || fail "outsider: $(cat "$WORK/last.out")"
# ...and, were the mode loosened, SO_PEERCRED refuses it with a message naming the group.
chmod 666 "$sock"
expect_exit 10 as "$OUTSIDER" "$PEER" join "$SH/ledger" "$SH/model" --socket "$sock"
grep -q "rejected invalid: user $OUTSIDER (pid [0-9]*) may not join: not a member of group $GRP" \
    "$WORK/last.out" || fail "outsider refusal: $(cat "$WORK/last.out")"
wait_until 5 grep -q "^refused: refused pid [0-9]* (user $OUTSIDER)" "$WORK/h3.out"
kill -TERM "$h3_pid"; wait "$h3_pid"
wait "$mpid" # the member's joiner sees the host close: exit 11
grep -q '^gone eof' "$WORK/member.out" || fail "member after host stop: $(cat "$WORK/member.out")"
finish
