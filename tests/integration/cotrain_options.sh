# Co-training between real `tandem finetune` processes whose adapters differ (issue 15,
# docs/co-training.md), on the tiny random model, CPU device, private ledger directories:
#  - four finetunes join one host: three with other ranks, targets, learning rates and epochs,
#    one with its own seed, grad accumulation, LR schedule, warmup, weight decay, clipping,
#    validation split and eval/save/log points; each adapter ends equal to training it alone
#    (--no-join) within 1e-3 relative, the last with the checkpoints of its alone run;
#  - a joiner with another --schedule (run-wide) is refused naming it (exit 2);
#  - a round-robin and a priority-val-loss host each admit a joined adapter (equal to alone);
#  - finetunes of another base (--method qlora; a copy of the model with another config.json)
#    find no host, say why, and train in processes of their own.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
cp -r "$M" "$WORK/tiny-eps"
sed -i 's/"rms_norm_eps": 1e-6/"rms_norm_eps": 1e-5/' "$WORK/tiny-eps/config.json"
grep -q '"rms_norm_eps": 1e-5' "$WORK/tiny-eps/config.json" || fail "config copy not changed"
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 4 # reverse 4, upper 2, add 6 lines
cd "$WORK" || exit 1
# --method lora: the dense base loads and trains faster on the CPU than NF4 (co-training is the
# same for both)
COMMON=(--method lora --batch-size 2 --val-split 0 --log-every 1 --lr-schedule constant
        --max-seq-len 64 --device cpu)
FT=("$TANDEM" finetune "$M" "${COMMON[@]}") # started directly, so that $! is the finetune's pid
ft() { "${FT[@]}" "$@"; }

# joiner K DIR [FLAGS...]: the four joiners' adapters (2 to 4 optimizer steps; tiny data keeps
# the test short: the comparisons are exact, a few steps show any difference)
joiner() {
    local k=$1 d=$2; shift 2
    case $k in
    1) ft --adapter data/reverse.jsonl:$d/j1 --rank 4 --targets q_proj,v_proj --lr 1e-3 --epochs 1 "$@" ;;
    2) ft --adapter data/upper.jsonl:$d/j2 --rank 8 --targets gate_proj,up_proj,down_proj \
          --lr 5e-4 --epochs 2 --batch-size 1 "$@" ;;
    3) ft --adapter data/add.jsonl:$d/j3 --rank 2 --targets k_proj,o_proj --lr 2e-3 --epochs 1 \
          --batch-size 3 "$@" ;;
    4) ft --adapter data/reverse.jsonl:$d/j4 --epochs 2 --batch-size 1 --seed 9 --grad-accum 2 \
          --lr-schedule linear --warmup-steps 2 --weight-decay 0.01 --max-grad-norm 0.5 \
          --val-split 0.25 --eval-every 1 --save-every 1 --log-every 2 "$@" ;;
    esac
}

# references, each alone in a process of its own (in the background, beside the co-trained runs)
refs() { for k in 1 2 3 4; do joiner $k ref --no-join >ref$k.out 2>ref$k.err || echo "ref $k: $?"; done; }
refs >refs.log 2>&1 &
refs_pid=$!

# three hosts, each in a ledger directory of its own (its own seed, 6 steps): synchronized
# (with save points of its own), round-robin, priority-val-loss; each held stopped until its
# joiners' joins are sent (hold_host: 6 tiny steps could end first), so started one by one
declare -A hp jn
for s in synchronized round-robin priority-val-loss; do
    mkdir -p "$WORK/ledger-$s"
    TANDEM_LEDGER_DIR="$WORK/ledger-$s" "${FT[@]}" --adapter data/add.jsonl:$s/host --epochs 2 \
        --seed 7 --save-every 4 --schedule $s >$s-host.out 2>$s-host.err &
    hp[$s]=$!
    hold_host "${hp[$s]}" "$WORK/ledger-$s"
done
# four joiners of the synchronized host, started together
export TANDEM_LEDGER_DIR="$WORK/ledger-synchronized"
for k in 1 2 3 4; do
    joiner $k co >co$k.out 2>co$k.err &
    jn[$k]=$!
done
# one joiner each for the round-robin and priority-val-loss hosts
for s in round-robin priority-val-loss; do
    TANDEM_LEDGER_DIR="$WORK/ledger-$s" joiner 2 $s --schedule $s >$s-join.out 2>$s-join.err &
    jn[$s]=$!
done
# finetunes of another base, beside the (held) round-robin host, find no host and train on
# their own
TANDEM_LEDGER_DIR="$WORK/ledger-round-robin" "${FT[@]}" --adapter data/upper.jsonl:other/qlora \
    --epochs 1 --method qlora >qlora.out 2>qlora.err &
qlora=$!
TANDEM_LEDGER_DIR="$WORK/ledger-round-robin" "$TANDEM" finetune "$WORK/tiny-eps" "${COMMON[@]}" \
    --adapter data/upper.jsonl:other/eps --epochs 1 >eps.out 2>eps.err
rc=$?
[ $rc -eq 0 ] || { fail "other config exited $rc"; sed 's/^/  /' eps.err >&2; }
wait $qlora || { fail "--method qlora exited $?"; sed 's/^/  /' qlora.err >&2; }
grep -q "not joining: .*differs in: method" qlora.err || { fail "qlora: no reason"; cat qlora.err >&2; }
grep -q "not joining: .*differs in: model" eps.err || { fail "other config: no reason"; cat eps.err >&2; }
grep -q "joined the finetune" qlora.err eps.err && fail "another base joined"
for a in qlora eps; do [ -s other/$a/adapter_model.safetensors ] || fail "$a: not trained"; done

# another schedule is run-wide: refused, naming it
joiner 1 sched --schedule round-robin >sched.out 2>sched.err &
sched=$!
release_host "${hp[synchronized]}" co1.err co2.err co3.err co4.err sched.err
for s in round-robin priority-val-loss; do release_host "${hp[$s]}" $s-join.err; done
wait $sched
rc=$?
[ $rc -eq 2 ] || fail "another --schedule: exit $rc, want 2"
grep -q "run-wide options differ.*(schedule)" sched.err ||
    { fail "another --schedule: not refused naming it"; sed 's/^/  /' sched.err >&2; }
for k in 1 2 3 4 round-robin priority-val-loss; do
    wait "${jn[$k]}"
    rc=$?
    e=co$k.err h=${hp[synchronized]}
    case $k in [a-z]*) e=$k-join.err h=${hp[$k]} ;; esac
    [ $rc -eq 0 ] || { fail "joiner $k exited $rc"; sed 's/^/  joiner: /' $e >&2; }
    grep -q "joined the finetune of pid $h " $e || fail "joiner $k did not join its host $h"
done
for s in synchronized round-robin priority-val-loss; do
    wait "${hp[$s]}" || fail "$s host exited $?"
done
[ "$(grep -c 'joined: adapter' synchronized-host.err)" -eq 4 ] ||
    fail "the synchronized host did not list 4 joined adapters"
for s in round-robin priority-val-loss; do
    grep -q "joined: adapter 1: $WORK/data/upper.jsonl" $s-host.err || fail "$s: host did not list it"
done

wait $refs_pid
[ -s refs.log ] && { fail "a reference run failed"; cat refs.log ref*.err >&2; }
for k in 1 2 3 4; do close_adapters ref/j$k co/j$k || fail "co/j$k differs from training it alone"; done
# one adapter trains the same under every schedule: the synchronized reference is its alone run
for s in round-robin priority-val-loss; do
    close_adapters ref/j2 $s/j2 || fail "$s/j2 differs from training it alone"
done
# its own save points (every step), counted from its join
[ "$(cd ref/j4 && ls -d checkpoint-*)" = "$(cd co/j4 && ls -d checkpoint-*)" ] ||
    fail "co/j4's checkpoints differ from its alone run's"
[ "$(ls -d co/j4/checkpoint-* | wc -l)" -eq 4 ] || fail "co/j4: not one checkpoint per step"
finish
