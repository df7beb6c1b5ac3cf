# --save-total-limit N (docs/finetune.md): each adapter keeps only its last N checkpoint-*
# directories, plus best/, which is never pruned; the kept ones resume; 0 (the default) keeps
# every checkpoint; a run with a limit co-trains like any other (it advertises a host; the
# limits of joined adapters: integration.cotrain_toml).
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 8
cd "$WORK" || exit 1
COMMON=(--epochs 2 --batch-size 2 --val-split 0.25 --eval-every 2 --save-every 2 --log-every 1
        --max-seq-len 64 --device cpu)
ckpts() { (cd "$1" && ls -d checkpoint-* 2>/dev/null | sort -t- -k2 -n | tr '\n' ' '); }

expect_exit 0 "$TANDEM" finetune "$M" --adapter data/reverse.jsonl:all/r --adapter data/upper.jsonl:all/u \
    "${COMMON[@]}" --no-join
full=$(ckpts all/r)
[ "$(echo $full | wc -w)" -ge 3 ] || fail "the reference run has too few checkpoints to prune: $full"

# two adapters, limit 2: the last two of each, best/ kept beside them
"$TANDEM" finetune "$M" --adapter data/reverse.jsonl:lim/r --adapter data/upper.jsonl:lim/u \
    "${COMMON[@]}" --save-total-limit 2 >lim.out 2>lim.err &
pid=$!
advertised=no
while kill -0 $pid 2>/dev/null; do
    ls "$TANDEM_LEDGER_DIR"/cotrain-$pid.json >/dev/null 2>&1 && advertised=yes
    sleep 0.05
done
wait $pid || fail "finetune --save-total-limit 2 exited $?: $(cat lim.err)"
[ $advertised = yes ] || fail "a run with --save-total-limit did not serve as a co-training host"
for a in r u; do
    want=$(ckpts all/$a | awk '{print $(NF-1), $NF}')
    [ "$(ckpts lim/$a)" = "$want " ] || fail "lim/$a keeps '$(ckpts lim/$a)', want the last two '$want'"
    [ -s lim/$a/best/adapter_model.safetensors ] || fail "lim/$a: best/ was pruned"
    cmp -s all/$a/adapter_model.safetensors lim/$a/adapter_model.safetensors ||
        fail "lim/$a: pruning changed the result"
done
# the last kept checkpoint still resumes (nothing left to do)
expect_exit 0 "$TANDEM" finetune "$M" --adapter data/reverse.jsonl:lim/r --adapter data/upper.jsonl:lim/u \
    "${COMMON[@]}" --save-total-limit 2 --resume
grep -q "nothing to do" "$WORK/last.out" || fail "--resume after pruning: $(cat "$WORK/last.out" "$WORK/last.err")"
expect_exit 2 "$TANDEM" finetune "$M" --adapter data/reverse.jsonl:x/r --save-total-limit -1 --device cpu
grep -q -- "--save-total-limit needs an integer >= 0" "$WORK/last.err" || fail "bad value: $(cat "$WORK/last.err")"
expect_exit 1 "$TANDEM" finetune "$M" --adapter data/reverse.jsonl:x/r --save-total-limit 1 --device cpu --join require
grep -q "join require: no finetune of this base model runs on cpu" "$WORK/last.err" ||
    fail "--join require with a limit and no host: $(cat "$WORK/last.err")"
finish
