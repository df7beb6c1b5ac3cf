# Co-training of an adapters.toml whose rows set training options of their own (issue 15,
# docs/co-training.md "Run-wide options", docs/adapters-toml.md): a real `tandem finetune
# --adapters-config` joins a running host (CPU, the tiny model, the test's own ledger directory);
# its two adapters differ from each other and from the host in seed, grad accumulation, LR
# schedule, warmup, weight decay, clipping, validation split, eval/save/log points,
# --save-total-limit and how their data is read (rev: no chat template, the prompt in the loss, file
# order; add: a bad line skipped, which the host would refuse otherwise). Each ends equal to the same file trained alone (--no-join) within 1e-3
# relative, with the alone run's checkpoints (each pruned by its own limit, not the host's),
# and the host's adapter equal to its own alone run. Carrying one set of options per join would
# give the second row the first row's seed and accumulation and fail the comparison.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 4 # reverse 4, upper 2, add 6 lines
cd "$WORK" || exit 1
{ head -2 data/add.jsonl; echo '{"instruction": "add 1 1"}'; tail -4 data/add.jsonl; } >data/add_bad.jsonl
COMMON=(--method lora --batch-size 1 --val-split 0 --log-every 1 --max-seq-len 64 --device cpu)
FT=("$TANDEM" finetune "$M" "${COMMON[@]}")

# the file: command defaults (the flags above), then rows with options of their own
write_toml() { # DIR
    mkdir -p "$1"
    cat >"$1/adapters.toml" <<EOF
epochs = 2
[[adapter]]
label = "rev"
data = "$WORK/data/reverse.jsonl"
output = "rev"
seed = 9
grad_accum = 2
lr_schedule = "linear"
warmup_steps = 2
save_every = 1
save_total_limit = 2
chat_template = "none"
train_on_prompt = true
no_shuffle = true
[[adapter]]
label = "add"
data = "$WORK/data/add_bad.jsonl"
output = "add"
skip_bad_lines = true
rank = 4
seed = 3
weight_decay = 0.01
max_grad_norm = 0.5
val_split = 0.25
eval_every = 1
log_every = 2
save_every = 2
EOF
}
write_toml ref
write_toml co
HOST=(--adapter data/upper.jsonl:HOSTDIR --epochs 12 --seed 7 --save-every 1 --save-total-limit 1)

# references, in processes of their own
"${FT[@]}" --adapters-config ref/adapters.toml --no-join >ref.out 2>ref.err &
ref=$!
"${FT[@]}" "${HOST[@]/HOSTDIR/ref/host}" --no-join >refh.out 2>refh.err &
refh=$!

"${FT[@]}" "${HOST[@]/HOSTDIR/co/host}" >host.out 2>host.err &
host=$!
hold_host $host
"${FT[@]}" --adapters-config co/adapters.toml >join.out 2>join.err &
joiner=$!
release_host $host join.err
wait $joiner || fail "the adapters.toml run exited $?"
grep -q "joined the finetune of pid $host " join.err ||
    { fail "the adapters.toml run did not join its host"; sed 's/^/  /' join.err >&2; }
wait $host || fail "host exited $?"
[ "$(grep -c 'joined: adapter' host.err)" -eq 2 ] || fail "the host did not list 2 joined adapters"
wait $ref || { fail "reference exited $?"; sed 's/^/  /' ref.err >&2; }
wait $refh || { fail "host reference exited $?"; sed 's/^/  /' refh.err >&2; }

for a in rev add; do
    close_adapters ref/$a co/$a || fail "co/$a differs from training it alone"
    [ "$(jq -c .tokens ref/$a/metrics.jsonl)" = "$(jq -c .tokens co/$a/metrics.jsonl)" ] ||
        fail "co/$a: other loss-token counts than alone (its data read another way)"
done
close_adapters ref/host co/host || fail "the host's adapter differs from training it alone"
for a in rev add host; do
    [ "$(cd ref/$a && ls -d checkpoint-* | tr '\n' ' ')" = "$(cd co/$a && ls -d checkpoint-* | tr '\n' ' ')" ] ||
        fail "co/$a's checkpoints differ from its alone run's: $(ls -d co/$a/checkpoint-*)"
done
# each pruned by its own limit: rev keeps 2, add all (every 2 steps), the host 1
[ "$(ls -d co/rev/checkpoint-* | wc -l)" -eq 2 ] || fail "co/rev: not its own limit of 2"
[ "$(ls -d co/add/checkpoint-* | wc -l)" -ge 3 ] || fail "co/add: pruned by another limit"
[ "$(ls -d co/host/checkpoint-* | wc -l)" -eq 1 ] || fail "co/host: not its limit of 1"
# the rows' own points: add validated (val_split 0.25, eval every step), rev did not
grep -q '"val_loss": *[0-9]' co/add/metrics.jsonl || fail "co/add: no validation of its own"
finish
