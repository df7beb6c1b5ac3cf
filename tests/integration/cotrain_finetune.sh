# Co-training between real `tandem finetune` processes (issue 15; docs/co-training.md), on the
# tiny random model, CPU device, one private ledger directory:
#  - two finetunes, the second started while the first runs (held stopped until the second's join
#    is sent: hold_host): the second joins the first (it says so; the host lists
#    the joined adapter with the joiner's pid), both exit 0, and both adapters equal training
#    each alone (--no-join) within the fused == alone tolerance of unit.trainer;
#  - a joiner with a bad data line gets FILE:LINE and exit 1 while the host trains on to the
#    alone result; a joiner's Ctrl-C before its admission withdraws the join (exit 130, nothing
#    written);
#  - Ctrl-C on a joiner hands its adapter back with a checkpoint (exit 130, the resume command);
#    --resume then joins the host, which resumes it from its checkpoint, and finishes it equal
#    to the uninterrupted run; the host is undisturbed;
#  - the host's Ctrl-C hands a joined adapter back: its joiner exits 130 with the resume command;
#  - --join require without a host fails (exit 1); --no-join runs never meet.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 16 # reverse 16, add 24 lines
cd "$WORK" || exit 1
printf '%s\n' '{"instruction": "add 1 2", "response": "3"}' '{"instruction": ' >data/bad.jsonl
COMMON=(--batch-size 2 --epochs 2 --val-split 0 --log-every 1 --save-every 4
        --lr-schedule constant --max-seq-len 64 --seed 7 --device cpu)

# references: each alone, in a process of its own
expect_exit 0 "$TANDEM" finetune "$M" --adapter data/reverse.jsonl:ref/reverse "${COMMON[@]}" --no-join
expect_exit 0 "$TANDEM" finetune "$M" --adapter data/add.jsonl:ref/add "${COMMON[@]}" --no-join

# two finetunes, the second started while the first runs: one process trains both
"$TANDEM" finetune "$M" --adapter data/reverse.jsonl:co/reverse "${COMMON[@]}" >host.out 2>host.err &
host=$!
hold_host $host
"$TANDEM" finetune "$M" --adapter data/add.jsonl:co/add "${COMMON[@]}" >join.out 2>join.err &
joiner=$!
release_host $host join.err
wait $joiner
rc=$?
wait $host || fail "host exited $?"
[ $rc -eq 0 ] || { fail "joiner exited $rc"; sed 's/^/  joiner: /' join.err >&2; }
grep -q "joined the finetune of pid $host " join.err || fail "the joiner did not say it joined $host"
grep -q "joined: adapter 1: $WORK/data/add.jsonl -> $WORK/co/add, from pid " host.err ||
    fail "the host did not list the joined adapter"
grep -q '^\[add\] done: ' join.out || fail "the joiner did not show its adapter's progress"
grep -q '^\[add\]' host.out && fail "the host printed the joiner's progress as its own"
for a in reverse add; do
    close_adapters ref/$a co/$a || fail "co/$a differs from training it alone"
done
ls "$TANDEM_LEDGER_DIR"/cotrain-*.json >/dev/null 2>&1 && fail "advertisement left behind"

# a joiner with bad data: FILE:LINE, exit 1; the host trains on
"$TANDEM" finetune "$M" --adapter data/reverse.jsonl:bad/reverse "${COMMON[@]}" >host2.out 2>host2.err &
host=$!
hold_host $host
"$TANDEM" finetune "$M" --adapter data/bad.jsonl:bad/bad "${COMMON[@]}" >badj.out 2>badj.err &
joiner=$!
# and a joiner's Ctrl-C before it is admitted withdraws its join: exit 130, nothing trained
"$TANDEM" finetune "$M" --adapter data/add.jsonl:wd/add "${COMMON[@]}" >wd.out 2>wd.err &
wd=$!
wait_until 30 waiting_for_host $host wd.err
kill -INT $wd
wait $wd
rc=$?
[ $rc -eq 130 ] || { fail "Ctrl-C before admission: exit $rc, want 130"; sed 's/^/  /' wd.err >&2; }
release_host $host badj.err
wait $joiner
rc=$?
[ $rc -eq 1 ] || { fail "the joiner with a bad line exited $rc, want 1"; sed 's/^/  joiner: /' badj.err >&2; }
grep -q "refused 1 adapter(s) of pid $joiner (.*): bad lines" host2.err ||
    fail "the host did not refuse the bad joiner"
grep -q "data/bad.jsonl:2" badj.err || { fail "no FILE:LINE for the bad line"; cat badj.err >&2; }
wait $host || fail "host with a refused joiner exited $?"
[ -z "$(ls -A wd/add 2>/dev/null)" ] || fail "the withdrawn join wrote into its OUT_DIR: $(ls wd/add)"
cmp -s ref/reverse/adapter_model.safetensors bad/reverse/adapter_model.safetensors ||
    close_adapters ref/reverse bad/reverse || fail "the host was disturbed by a refused join"

# joined_pair NAME HOST_LOG [JOINER_FLAGS...]: a host training reverse into NAME/reverse (8
# epochs; output HOST_LOG.out/.err) and a joiner training add into NAME/add (NAME.out/.err),
# admitted and past its step 5; sets $host and $joiner
joined_pair() {
    local name=$1 log=$2
    shift 2
    "$TANDEM" finetune "$M" --adapter data/reverse.jsonl:$name/reverse "${COMMON[@]}" --epochs 8 \
        >$log.out 2>$log.err &
    host=$!
    hold_host $host
    "$TANDEM" finetune "$M" --adapter data/add.jsonl:$name/add "${COMMON[@]}" "$@" \
        >$name.out 2>$name.err &
    joiner=$!
    release_host $host $name.err
    wait_until 60 grep -q '^\[add\] epoch 0.* step 5/' $name.out
}

# Ctrl-C on a joiner: checkpoint, exit 130 with the resume command; --resume finishes it
joined_pair int host3
kill -INT $joiner
wait $joiner
rc=$?
[ $rc -eq 130 ] || { fail "interrupted joiner exited $rc, want 130"; sed 's/^/  joiner: /' int.err >&2; }
grep -q -- "--resume" int.err || fail "no resume command after the joiner's Ctrl-C"
ls -d int/add/checkpoint-* >/dev/null 2>&1 || fail "no checkpoint of the handed-back adapter"
kill -0 $host 2>/dev/null || fail "the host ended with its joiner"
hold_host $host
"$TANDEM" finetune "$M" --adapter data/add.jsonl:int/add "${COMMON[@]}" --resume >res.out 2>res.err &
joiner=$!
release_host $host res.err
wait $joiner || { fail "the --resume exited $?"; sed 's/^/  joiner: /' res.err >&2; }
grep -q "joined the finetune of pid $host " res.err ||
    fail "the --resume did not join the running host (it resumes inside it)"
close_adapters ref/add int/add || fail "joiner Ctrl-C + --resume differs from the uninterrupted run"
wait $host || fail "host of the interrupted joiner exited $?"
grep -q "handed back" host3.err || fail "the host did not say it handed the adapter back"

# the host's own Ctrl-C hands the joined adapter back: the joiner exits 130 (not 0: its adapter
# is unfinished) with the resume command, naming no signal it did not get
joined_pair hs host4 --epochs 8
kill -INT $host
wait $host
rc=$?
[ $rc -eq 130 ] || fail "the interrupted host exited $rc, want 130"
wait $joiner
rc=$?
[ $rc -eq 130 ] || { fail "the joiner of a stopped host exited $rc, want 130"; sed 's/^/  joiner: /' hs.err >&2; }
grep -q "^tandem: the finetune this one joined stopped: handed back by the finetune of pid $host" \
    hs.err || fail "the joiner did not say its host stopped: $(cat hs.err)"
grep -q "SIGUSR1" hs.err && fail "the joiner named a SIGUSR1 nobody sent"
grep -q -- "--resume\$" hs.err || fail "no resume command for the joiner of a stopped host"

# --join require without a host; --no-join runs never join
expect_exit 1 "$TANDEM" finetune "$M" --adapter data/add.jsonl:req/add "${COMMON[@]}" --join require
grep -q "no finetune of this base model.*start the finetune to join first, or leave out --join require" \
    "$WORK/last.err" || fail "--join require: no reason or no advice: $(cat "$WORK/last.err")"
expect_exit 2 "$TANDEM" finetune "$M" --adapter data/add.jsonl:req/add "${COMMON[@]}" --join require \
    --no-join
grep -q -- "--no-join and --join require contradict each other" "$WORK/last.err" ||
    fail "--no-join with --join require: $(cat "$WORK/last.err")"
[ -e req ] && fail "a refused --join require wrote req/"
"$TANDEM" finetune "$M" --adapter data/reverse.jsonl:sep/reverse "${COMMON[@]}" --epochs 1 --no-join \
    >sep1.out 2>sep1.err &
p1=$!
sleep 0.5
expect_exit 0 "$TANDEM" finetune "$M" --adapter data/add.jsonl:sep/add "${COMMON[@]}" --epochs 1 --no-join
wait $p1 || fail "--no-join run exited $?"
grep -q "joined" "$WORK/last.err" sep1.err && fail "--no-join runs joined"
finish
