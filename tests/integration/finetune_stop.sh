# Graceful stop of `tandem finetune` (issue 13 item 15), on the tiny random model (CPU):
#  - SIGINT / SIGTERM / SIGUSR1 at random moments of a run stop it gracefully: exit 130 / 143 /
#    0, a message saying what was saved and the command to resume; --resume then gives the
#    uninterrupted run's adapter bytes and logged losses (four runs);
#  - a second SIGINT (later than the repeat window) ends the process at once, by the signal;
#  - under `tandem gpu run`: SIGUSR1 is forwarded, a process-group Ctrl-C is one graceful stop;
#  - SIGUSR1 before the first step (queued for a simulated GPU's memory) ends the run at once
#    with exit 0 and the command to continue, as a Slurm batch script needs to requeue it.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 16
cd "$WORK" || exit 1
COMMON=(--batch-size 4 --epochs 2 --val-split 0.1 --log-every 1 --eval-every 3 --save-every 5
        --lr-schedule constant --max-seq-len 64 --seed 7 --device cpu)
ads() { # ads PREFIX: the --adapter flags of a run into PREFIX/
    echo --adapter data/reverse.jsonl:$1/reverse --adapter data/add.jsonl:$1/add
}

# the uninterrupted reference; its training's length (ms, from the "adapter 1:" line the runs
# below wait for, to the exit) spreads the signals over a run. The whole run's length, load
# included, let all four signals of an ASan run land after training once the CPU's GEMMs got
# faster (2026-12-07)
"$TANDEM" finetune "$M" $(ads ref) "${COMMON[@]}" >ref.out 2>ref.err &
ref_pid=$!
wait_until 60 grep -q "^adapter 1:" ref.out
t0=$(date +%s%N)
wait $ref_pid || fail "reference run: exit $?: $(cat ref.err)"
RUN_MS=$(( ($(date +%s%N) - t0) / 1000000 ))
echo "reference run: $RUN_MS ms of training"

# stop_and_resume SIGNAL WANT_EXIT RUN: starts a run, sends SIGNAL at a random moment after
# training began (within the first 80 % of the reference run's length: a fixed 0-3 s let all
# four signals of a fast machine land after the end), checks the graceful stop, resumes and
# compares with the reference
stop_and_resume() {
    local sig=$1 want=$2 run=$3
    "$TANDEM" finetune "$M" $(ads $run) "${COMMON[@]}" >$run.out 2>$run.err &
    local pid=$!
    wait_until 60 grep -q "^adapter 1:" $run.out
    local ms=$(( RANDOM * (RUN_MS * 8 / 10) / 32768 ))
    sleep "$((ms / 1000)).$(printf %03d $((ms % 1000)))"
    kill -s "$sig" $pid 2>/dev/null
    wait $pid
    local got=$?
    if grep -q "to continue exactly where it stopped" $run.err; then
        [ "$got" -eq "$want" ] || fail "$run: SIG$sig: exit $got, want $want"
        grep -q -- "--resume\$" $run.err || fail "$run: no resume command: $(cat $run.err)"
        # the command runs the binary that was started (a cluster node's own path), not PATH's
        grep -qF "  $TANDEM finetune " $run.err || fail "$run: the resume command is not $TANDEM's"
        grep -q "^tandem: SIG$sig: stopped" $run.err || fail "$run: no stop message: $(cat $run.err)"
    elif [ -f $run/reverse/adapter_model.safetensors ] && [ -f $run/add/adapter_model.safetensors ]
    then
        # training ended before the signal: exit 0, or (INT/TERM landing after training, while
        # the process prints its report and exits: slow under ASan) death by the signal's
        # default action, which docs/finetune.md states for that phase
        case "$sig:$got" in
            *:0|INT:130|TERM:143) echo "note: $run finished before SIG$sig (exit $got)" ;;
            *) fail "$run: SIG$sig after training: exit $got: $(cat $run.err)" ;;
        esac
    else
        fail "$run: SIG$sig during training: exit $got without a stop message: $(cat $run.err)"
    fi
    expect_exit 0 "$TANDEM" finetune "$M" $(ads $run) "${COMMON[@]}" --resume
    same_run ref $run "SIG$sig then --resume differs from the uninterrupted run" reverse add
}
stop_and_resume INT 130 int1
stop_and_resume INT 130 int2
stop_and_resume TERM 143 term1
stop_and_resume USR1 0 usr1
# at least one of the stops found the run with steps taken and saved them
grep -l "step [0-9]* of [0-9]* saved" int1.err int2.err term1.err usr1.err \
    >/dev/null || fail "no stop saved a checkpoint"

# a second Ctrl-C stops at once: one step of 8 sequences of ~2000 tokens (several seconds of CPU;
# 4 of ~510 were enough before the CPU attention became GEMMs), two SIGINTs 0.8 s apart, the
# process ends by the signal without the graceful stop's message
long_data() { # long_data N CHARS: N copy tasks of CHARS characters each way
    awk -v n="$1" -v c="$2" 'BEGIN { for (i = 0; i < n; i++) { s = ""; for (k = 0; k < c; k++) s = s substr("abcdefghij", 1 + (i * 7 + k * 3) % 10, 1); printf("{\"instruction\": \"copy: %s\", \"response\": \"%s\"}\n", s, s) } }'
}
long_data 8 990 >hard.jsonl
long_data 8 490 >long.jsonl
# perl runs it so that the raw wait status tells a death by signal from exit(130)
status=$(perl -e '
    my $pid = fork();
    if ($pid == 0) { open(STDOUT, ">", "hard2.out"); open(STDERR, ">", "hard2.err"); exec(@ARGV); exit 127 }
    for (1 .. 1200) { last if `grep -c "^adapter 0:" hard2.out 2>/dev/null` > 0; select(undef, undef, undef, 0.05) }
    select(undef, undef, undef, 0.2); kill("INT", $pid);
    select(undef, undef, undef, 0.8); kill("INT", $pid);
    waitpid($pid, 0); my $s = $?;
    print(($s & 127) ? "signal " . ($s & 127) : "exit " . ($s >> 8))' \
    "$TANDEM" finetune "$M" --adapter hard.jsonl:hard2/long --batch-size 8 --max-seq-len 2048 \
        --val-split 0 --device cpu)
[ "$status" = "signal 2" ] || fail "second SIGINT: ended with $status, want signal 2: $(cat hard2.err)"
grep -q "to continue exactly" hard2.err && fail "second SIGINT: graceful stop message printed"

# under `tandem gpu run`: SIGUSR1 to the wrapper is forwarded (Slurm signals the job's
# processes), and a Ctrl-C to the whole process group (the terminal's way, which the wrapper
# also forwards: two SIGINTs at once) is one graceful stop, not an immediate one
# The runs train long.jsonl (four steps of two ~1000-token sequences, about 0.6 s of CPU each on
# the 2-core VM), so the signal sent 0.5 s after the start lands inside the run, never after its
# end.
LONG=(--batch-size 2 --max-seq-len 1024 --val-split 0 --epochs 1 --save-every 0 --seed 7 --device cpu)
gpu_stop() { # gpu_stop SIGNAL RUN: the graceful stop's exit code, or "none"
    local sig=$1 run=$2
    set -m
    "$TANDEM" gpu run --vram 1 -- "$TANDEM" finetune "$M" --adapter long.jsonl:$run/long "${LONG[@]}" \
        >$run.out 2>$run.err &
    local pid=$!
    set +m
    wait_until 60 grep -q "^adapter 0:" $run.out
    sleep 0.5
    if [ "$sig" = USR1 ]; then kill -USR1 $pid; else kill -INT -- -$pid; fi
    wait $pid
    echo $?
}
got=$(gpu_stop USR1 gusr)
grep -q "to continue exactly" gusr.err && [ "$got" = 0 ] || fail "gpu run + USR1: exit $got: $(cat gusr.err)"
got=$(gpu_stop INT gint)
grep -q "to continue exactly" gint.err && [ "$got" = 130 ] || fail "gpu run + group SIGINT: exit $got: $(cat gint.err)"
expect_exit 0 "$TANDEM" finetune "$M" --adapter long.jsonl:gint/long "${LONG[@]}" --resume
expect_exit 0 "$TANDEM" finetune "$M" --adapter long.jsonl:lref/long "${LONG[@]}"
same_run lref gint "Ctrl-C under gpu run then --resume differs" long

# SIGUSR1 while queued: a holder takes 1 GiB of a simulated GPU's 1700 MiB ledger capacity, the
# finetune (a 1261 MiB plan) waits for its memory, and Slurm's "time is nearly up" must end it
# with 0 (a death by the signal, 138, would end the job instead of requeueing it); its resume
# then trains from the start
SIM=(TANDEM_FAKE_GPUS="uuid=GPU-sim-stop,name=Sim,total_mb=2000" TANDEM_SIM_GPU_COMPUTE=cpu)
reserved_on_sim() {
    [ "$(env "${SIM[@]}" "$TANDEM" gpu status --json | jq '[.gpus[].reservations[]] | length')" -ge 1 ]
}
env "${SIM[@]}" "$TANDEM" gpu run --vram 1 -- sleep 120 >holder.out 2>holder.err &
holder=$!
wait_until 20 reserved_on_sim
env "${SIM[@]}" "$TANDEM" finetune "$M" --adapter long.jsonl:qusr/long "${LONG[@]/cpu/cuda}" \
    --no-join >qusr.out 2>qusr.err &
pid=$!
wait_until 30 grep -q "waiting for" qusr.err
kill -USR1 $pid
wait $pid
got=$?
[ "$got" = 0 ] || fail "SIGUSR1 while queued: exit $got, want 0: $(cat qusr.err)"
grep -q "^tandem: SIGUSR1: stopped before the first step of this run (nothing new to save)$" \
    qusr.err || fail "SIGUSR1 while queued: no stop message: $(cat qusr.err)"
grep -q -- "--no-join --resume$" qusr.err || fail "SIGUSR1 while queued: no resume command"
[ -e qusr/long/adapter_model.safetensors ] && fail "SIGUSR1 while queued: an adapter was written"
kill $holder
wait $holder
expect_exit 0 env "${SIM[@]}" "$TANDEM" finetune "$M" --adapter long.jsonl:qusr/long \
    "${LONG[@]/cpu/cuda}" --no-join --resume
[ -s qusr/long/adapter_model.safetensors ] || fail "resume after SIGUSR1 while queued: no adapter"

finish
