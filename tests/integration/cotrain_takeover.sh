# Host death between real `tandem finetune` processes (issue 15, behaviour 7; docs/co-training.md
# "Failure rules"), on the tiny random model, CPU device, one private ledger directory. Three
# finetunes co-train (reverse hosts, upper and add join it); then, three times, kill -9 of the
# current host at a random moment (0-2 steps after the latest resumed joiner's first step, plus
# 0-99 ms, so inside a step, a checkpoint write or a boundary; on an idle machine a late round may
# find every adapter finished and ends the rounds, round 1 always orphans two joiners):
#  - every orphaned joiner says the host died; exactly one of them takes over (it hosts, resuming
#    its adapter from its latest checkpoint) and the others join it with resume: two joiners
#    orphaned at once end up as one new host and one joiner, with no user action;
#  - the killed host's own adapter has nobody attached: `--resume` of its command joins the new
#    host, which resumes it inside its fused pass (a --resume joiner; the new host is held
#    stopped until that join is sent, hold_host, so it cannot finish first; a late round whose
#    new host finished before it could be held, or whose joiners had all finished, resumes it
#    alone);
# every process that was not killed exits 0, and the three adapters equal an uninterrupted run
# (one --no-join process) within the fused == alone tolerance; each orphan past its first
# checkpoint was resumed, not started over. The kill moments are printed. Then a stopped host
# (SIGSTOP) is waited for, not taken over.
# A soak with many random kills: bench/cotrain_takeover_soak.sh.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 6 # reverse 6, upper 3, add 9 lines
cd "$WORK" || exit 1
COMMON=(--batch-size 1 --val-split 0 --log-every 1 --save-every 2 --lr-schedule constant
        --max-seq-len 64 --seed 7 --device cpu --method lora --rank 4 --targets q_proj,v_proj)
declare -A EPOCHS=([reverse]=3 [upper]=6 [add]=2) # 18 optimizer steps each

# the uninterrupted run: the three adapters in one process of their own
for a in reverse upper add; do
    printf '[[adapter]]\ndata = "data/%s.jsonl"\noutput = "ref/%s"\nepochs = %d\n\n' \
        "$a" "$a" "${EPOCHS[$a]}"
done >ref.toml
expect_exit 0 "$TANDEM" finetune "$M" --adapters-config ref.toml "${COMMON[@]}" --no-join

declare -A PID ADAPTER LOG KILLED AT # adapter -> pid; pid -> adapter, log, killed, step at a kill
ALL=()
n_runs=0
OUT=co
# start ADAPTER [ARGS...]: its finetune in the background, output in ADAPTER.K.out/.err
start() {
    local a=$1
    shift
    n_runs=$((n_runs + 1))
    "$TANDEM" finetune "$M" --adapter "data/$a.jsonl:$OUT/$a" "${COMMON[@]}" --epochs "${EPOCHS[$a]}" \
        "$@" >"$a.$n_runs.out" 2>"$a.$n_runs.err" &
    PID[$a]=$!
    ADAPTER[$!]=$a
    LOG[$!]=$a.$n_runs
    ALL+=($!)
}
# the latest optimizer step a process printed (0 before any)
step_of() { grep -o ' step [0-9]*/' "${LOG[$1]}.out" 2>/dev/null | tail -1 | tr -dc 0-9 || true; }
finished() { grep -q '\] done:' "${LOG[$1]}.out" || ! kill -0 "$1" 2>/dev/null; }
step_at_least() { [ "$(step_of "$1")" -ge "$2" ] 2>/dev/null || finished "$1"; }
printed_step() { [ -n "$(step_of "$1")" ] || finished "$1"; }
joined() { grep -q "joined the finetune of pid $2 " "${LOG[$1]}.err"; }
took_over() { grep -q "taking over" "${LOG[$1]}.err"; }
died() { grep -q "the finetune of pid $2 died" "${LOG[$1]}.err"; }
# all_settled HOST PID...: each PID said HOST died, or finished
all_settled() {
    local h=$1 p
    shift
    for p in "$@"; do died "$p" "$h" || finished "$p" || return 1; done
}
any_took_over() {
    local p
    for p in "$@"; do took_over "$p" && return 0; done
    return 1
}

start reverse
host=${PID[reverse]}
hold_host "$host"
start upper
start add
joiners=("${PID[upper]}" "${PID[add]}")
release_host "$host" "${LOG[${PID[upper]}]}.err" "${LOG[${PID[add]}]}.err"
for p in "${joiners[@]}"; do wait_until 60 joined "$p" "$host"; done
watched=${PID[add]}
rounds=0

for round in 1 2 3; do
    wait_until 60 printed_step "$watched"
    target=$(($(step_of "$watched") + RANDOM % 3))
    ms=$((RANDOM % 100))
    wait_until 60 step_at_least "$watched" "$target"
    sleep "$(printf '0.%03d' $ms)"
    # an unloaded machine trains all 18 steps in a few seconds: a late round may find every
    # adapter finished (round 1, a few steps in, always has two orphans)
    orphans=()
    where=""
    for p in "${joiners[@]}"; do
        kill -0 "$p" 2>/dev/null && ! grep -q '\] done:' "${LOG[$p]}.out" && orphans+=("$p")
        where="$where ${ADAPTER[$p]}:$p@$(step_of "$p")"
        AT[$p]=$(step_of "$p")
    done
    host_at=$(step_of "$host")
    echo "round $round: kill -9 of host $host (${ADAPTER[$host]}) at step $target of" \
        "${ADAPTER[$watched]} + $ms ms; joiners (adapter:pid@step):$where"
    kill -9 "$host"
    wait "$host" 2>/dev/null
    KILLED[$host]=1
    if [ $round -eq 1 ] && [ ${#orphans[@]} -ne 2 ]; then fail "round 1: ${#orphans[@]} orphans"; fi
    # an orphan whose last adapter finished just before the kill is no orphan
    wait_until 60 all_settled "$host" "${orphans[@]}"
    live=()
    for p in "${orphans[@]}"; do died "$p" "$host" && live+=("$p"); done
    orphans=("${live[@]}")
    dead=${ADAPTER[$host]}
    if [ ${#orphans[@]} -eq 0 ]; then
        # the killed host's own adapter still needs its --resume: no host left, it trains alone
        echo "round $round: every adapter had finished"
        start "$dead" --resume
        break
    fi
    rounds=$round
    # exactly one orphan hosts, the others join it
    wait_until 60 any_took_over "${orphans[@]}"
    new=""
    for p in "${orphans[@]}"; do
        if took_over "$p"; then
            [ -z "$new" ] || fail "round $round: both $new and $p took over"
            new=$p
        fi
    done
    [ -n "$new" ] || { fail "round $round: nobody took over"; break; }
    # the killed host's own adapter: --resume joins the new host, held stopped until that join
    # and the other orphans' are sent (unless, in a late round, the new host finished its few
    # remaining steps before it could be held: then the --resume trains alone)
    held=1
    try_hold_host "$new" || held=0
    [ $held -eq 1 ] || [ $round -gt 1 ] || fail "round 1: the new host $new ended before it was held"
    start "$dead" --resume
    r=${PID[$dead]}
    rest=()
    for p in "${orphans[@]}"; do [ "$p" = "$new" ] || rest+=("$p"); done
    if [ $held -eq 1 ]; then
        errs=("${LOG[$r]}.err")
        for p in "${rest[@]}"; do errs+=("${LOG[$p]}.err"); done
        release_host "$new" "${errs[@]}"
        wait_until 60 joined "$r" "$new" || fail "round $round: --resume of $dead did not join $new"
        [ "${host_at:-0}" -lt 3 ] || wait_until 30 grep -q "from pid $r (.*), resumed at step" \
            "${LOG[$new]}.err" || fail "round $round: --resume of $dead was not resumed in $new"
    else
        echo "round $round: the new host $new had finished; --resume of $dead trains alone"
    fi
    for p in "${rest[@]}"; do
        wait_until 60 joined "$p" "$new" || fail "round $round: $p did not join the new host $new"
    done
    # resumed, not started over (that would end equal too): past step 2 a checkpoint exists
    for p in "${orphans[@]}"; do
        [ "${AT[$p]:-0}" -ge 3 ] || continue
        if [ "$p" = "$new" ]; then
            wait_until 30 grep -q "resuming from $OUT/${ADAPTER[$p]}/checkpoint-" "${LOG[$p]}.out" ||
                fail "round $round: the new host $p did not resume its adapter"
        else
            wait_until 30 grep -q "from pid $p (.*), resumed at step" "${LOG[$new]}.err" ||
                fail "round $round: the new host did not resume the adapter of $p"
        fi
    done
    echo "round $round: ${ADAPTER[$new]} (pid $new) took over, ${#rest[@]} other(s) joined it"
    joiners=("${rest[@]}" "$r")
    host=$new
    watched=$r
done

for p in "${ALL[@]}"; do
    [ -n "${KILLED[$p]:-}" ] && continue
    wait "$p"
    rc=$?
    if [ $rc -ne 0 ]; then
        fail "${ADAPTER[$p]} (pid $p) exited $rc"
        sed 's/^/  stderr: /' "${LOG[$p]}.err" >&2
    fi
done
n=$(cat ./*.err | grep -c "taking over")
[ "$n" -eq "$rounds" ] || fail "$n takeovers for $rounds host deaths with orphans"
for a in reverse upper add; do
    close_adapters "ref/$a" "co/$a" || fail "co/$a differs from the uninterrupted run"
done
ls "$TANDEM_LEDGER_DIR"/cotrain-*.json >/dev/null 2>&1 && fail "advertisement left behind"

# a stopped host (SIGSTOP, as Ctrl-Z does) is silent but alive: its joiner waits for it instead of
# taking over (two processes would write one OUT_DIR), and both finish when it continues
OUT=stop
start reverse
host=$!
hold_host "$host"
start add
joiner=$!
release_host "$host" "${LOG[$joiner]}.err"
wait_until 60 joined "$joiner" "$host" || fail "the joiner of the host to stop did not join it"
wait_until 60 step_at_least "$joiner" 2
kill -STOP "$host"
wait_until 10 grep -q "still exists (stopped or frozen?): waiting for it" "${LOG[$joiner]}.err"
sleep 0.5
kill -CONT "$host"
wait "$joiner" || fail "the joiner of a stopped host exited $?"
wait "$host" || fail "the stopped host exited $?"
grep -q "taking over" "${LOG[$joiner]}.err" && fail "the joiner took over a stopped host"
for a in reverse add; do
    close_adapters "ref/$a" "stop/$a" || fail "stop/$a differs from the uninterrupted run"
done
finish
