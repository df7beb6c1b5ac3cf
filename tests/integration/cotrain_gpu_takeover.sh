# A takeover on a simulated GPU (issue 15; docs/co-training.md, "In tandem finetune", step 2):
# real `tandem finetune --device cuda` processes of the tiny model, computing on the CPU backend
# (TANDEM_SIM_GPU_COMPUTE=cpu) while their reservations are real ledger entries in the test's own
# ledger directory.
#  - A holder takes the whole GPU; two finetunes of one base queue for it (FIFO), neither finds a
#    host before reserving. When the holder leaves, both get their reservation; the first to
#    elect hosts, the other finds it at device open, gives its reservation back and joins it.
#  - The host gets kill -9 once the joiner's first adapter has checkpoints and its second, which
#    saves only at its end (save_every = 0 in adapters.toml), has none.
#  - The joiner takes over: it reserves anew through the ledger, hosts, resumes its first adapter
#    from its latest checkpoint and starts the second over (instead of refusing with "no global
#    step that every adapter saved"); both end equal to the same adapters.toml trained alone
#    (--no-join); the dead host's reservation is gone and the orphan's is the only one
#    (`gpu status --json`), and none is left at the end.
#  - A host found at device open that ends (SIGTERM) while the join waits for memory: the joiner
#    elects again, reserves anew and hosts.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
export TANDEM_FAKE_GPUS="uuid=GPU-sim-0,name=Sim A,total_mb=10000"
export TANDEM_SIM_GPU_COMPUTE=cpu
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 8 # reverse 8, upper 4, add 12 lines
cd "$WORK" || exit 1
COMMON=(--method lora --batch-size 1 --val-split 0 --log-every 1 --lr-schedule constant
        --max-seq-len 64 --seed 7 --device cuda)
FT=("$TANDEM" finetune "$M" "${COMMON[@]}")
status() { "$TANDEM" gpu status --json; }
pids_reserved() { status | jq -c '[.gpus[].reservations[].pids[0]] | sort'; }
queued() { status | jq '[.gpus[].queue[]] | length'; }

write_toml() { # DIR: p checkpoints every step; q saves only at its end
    mkdir -p "$1"
    cat >"$1/adapters.toml" <<EOF
[[adapter]]
label = "p"
data = "$WORK/data/reverse.jsonl"
output = "p"
epochs = 3
save_every = 1
[[adapter]]
label = "q"
data = "$WORK/data/upper.jsonl"
output = "q"
epochs = 3
save_every = 0
EOF
}
for d in ref x y; do write_toml $d; done
"${FT[@]}" --adapters-config ref/adapters.toml --no-join --device cpu >ref.out 2>ref.err &
ref=$!

# the holder leaves nothing: both finetunes queue in the ledger before either can host
"$TANDEM" gpu run --gpu GPU-sim-0 --vram "$(awk 'BEGIN{printf "%.10f", 8500/1024}')" \
    --task holder -- sleep 60 >holder.out 2>&1 &
holder=$!
wait_until 20 sh -c "[ \"\$('$TANDEM' gpu status --json | jq '[.gpus[].reservations[]] | length')\" = 1 ]"
"${FT[@]}" --adapters-config x/adapters.toml >x.out 2>x.err &
px=$!
wait_until 30 sh -c "[ \"\$('$TANDEM' gpu status --json | jq '[.gpus[].queue[]] | length')\" = 1 ]"
"${FT[@]}" --adapters-config y/adapters.toml >y.out 2>y.err &
py=$!
wait_until 30 sh -c "[ \"\$('$TANDEM' gpu status --json | jq '[.gpus[].queue[]] | length')\" = 2 ]"
kill $holder
wait $holder 2>/dev/null

# one hosts, the other joined it at device open (after reserving: it gave its reservation back)
wait_until 60 grep -q "joined the finetune of pid" x.err y.err
if grep -q "joined the finetune of pid $py " x.err; then
    host=$py joiner=$px j=x h=y
else
    host=$px joiner=$py j=y h=x
fi
grep -q "joined the finetune of pid $host " $j.err || fail "no join of $host in $j.err: $(cat $j.err)"
grep -q "reserved .* MiB on GPU-sim-0" $j.err || fail "the joiner did not reserve before joining"
wait_until 20 sh -c "[ \"\$('$TANDEM' gpu status --json | jq -c '[.gpus[].reservations[].pids[0]]')\" = '[$host]' ]" ||
    fail "the joiner kept a reservation: $(pids_reserved)"

# kill -9 of the host once the joiner's p has checkpoints and its q none
wait_until 60 test -d $j/p/checkpoint-2
kill -9 $host
[ -z "$(ls -d $j/q/checkpoint-* 2>/dev/null)" ] || fail "$j/q saved a checkpoint before its end"
wait $host 2>/dev/null
wait_until 30 sh -c "[ \"\$('$TANDEM' gpu status --json | jq -c '[.gpus[].reservations[].pids[0]]')\" = '[$joiner]' ]" ||
    fail "no transfer of the reservation to the orphan: $(pids_reserved)"
wait $joiner
rc=$?
[ $rc -eq 0 ] || { fail "the orphan exited $rc"; sed 's/^/  orphan: /' $j.err >&2; }
grep -q "the finetune of pid $host died" $j.err || fail "the orphan did not notice the death"
grep -q "taking over: .* on GPU-sim-0" $j.err || fail "the orphan did not take over: $(cat $j.err)"
[ "$(grep -c 'reserved .* MiB on GPU-sim-0' $j.err)" -ge 2 ] || fail "the orphan did not reserve anew"
grep -q "^\[p\] resuming from $j/p/checkpoint-" $j.out || fail "p was not resumed"
grep -q "$j/q holds no checkpoint yet: this adapter starts over" $j.err || fail "q did not start over"
grep -q "run the same command with --resume" $j.err && fail "the orphan gave the --resume advice"
[ "$(queued)" = 0 ] || fail "tickets left in the ledger queue"
wait_until 10 sh -c "[ \"\$('$TANDEM' gpu status --json | jq '[.gpus[].reservations[]] | length')\" = 0 ]" ||
    fail "reservations left: $(pids_reserved)"

wait $ref || { fail "the reference exited $?"; sed 's/^/  /' ref.err >&2; }
for a in p q; do close_adapters ref/$a $j/$a || fail "$j/$a differs from training it alone"; done

# A host found at device open that ends before admitting the join elects anew (it does not exit
# asking to run again): holders leave room for two finetunes, which queue together; a third
# waiter queued behind them takes the memory the joiner gives back, so the host's growth waits
# (FIFO); the host is stopped; the joiner elects again, reserves once the waiter leaves, and hosts.
long() { "${FT[@]}" --adapter data/reverse.jsonl:$1 --epochs 400 >$2.out 2>$2.err & }
expect_exit 0 "${FT[@]}" --adapter data/reverse.jsonl:u/plan --epochs 1 --no-join # P: what one reserves
P=$(sed -n 's/^tandem: reserved \([0-9]*\) MiB on .*/\1/p' "$WORK/last.err")
[ -n "$P" ] || fail "no reservation line in the plan run"
"$TANDEM" gpu run --gpu GPU-sim-0 --vram "$(awk "BEGIN{printf \"%.10f\", (8500 - 2 * $P - 2)/1024}")" \
    --task h1 -- sleep 120 >h1.out 2>&1 &
h1=$!
"$TANDEM" gpu run --gpu GPU-sim-0 --vram "$(awk "BEGIN{printf \"%.10f\", 2 * $P/1024}")" \
    --task h2 -- sleep 120 >h2.out 2>&1 &
h2=$!
wait_until 20 sh -c "[ \"\$('$TANDEM' gpu status --json | jq '[.gpus[].reservations[]] | length')\" = 2 ]"
long u/a a; pa=$!
wait_until 30 sh -c "[ \"\$('$TANDEM' gpu status --json | jq '[.gpus[].queue[]] | length')\" = 1 ]"
long u/b b; pb=$!
wait_until 30 sh -c "[ \"\$('$TANDEM' gpu status --json | jq '[.gpus[].queue[]] | length')\" = 2 ]"
# w takes the joiner's reservation and the 2 MiB of slack, so that no re-planned rung of the
# host's memory plan (--recompute, checkpointing) fits without the growth waiting for w
"$TANDEM" gpu run --gpu GPU-sim-0 --vram "$(awk "BEGIN{printf \"%.10f\", ($P + 2)/1024}")" \
    --task w -- sleep 120 >w.out 2>&1 &
w=$!
wait_until 30 sh -c "[ \"\$('$TANDEM' gpu status --json | jq '[.gpus[].queue[]] | length')\" = 3 ]"
kill $h2
wait_until 60 grep -q "^tandem: waiting: the finetune of pid" a.err b.err
if grep -q "^tandem: waiting: the finetune of pid $pa " b.err; then
    host=$pa joiner=$pb j=b
else
    host=$pb joiner=$pa j=a
fi
kill -TERM $host
wait $host 2>/dev/null
wait_until 30 grep -q "ended before taking the adapters .*; electing again" $j.err ||
    { fail "the joiner did not elect again"; sed 's/^/  joiner: /' $j.err >&2; }
kill $w
wait $w 2>/dev/null
wait_until 30 test -e "$TANDEM_LEDGER_DIR/cotrain-$joiner.json" ||
    { fail "the joiner does not host after electing again"; sed 's/^/  joiner: /' $j.err >&2; }
[ "$(grep -c 'reserved .* MiB on GPU-sim-0' $j.err)" -ge 2 ] || fail "the joiner did not reserve anew"
kill -TERM $joiner
wait $joiner
rc=$?
[ $rc -eq 143 ] || { fail "the re-elected host exited $rc after SIGTERM"; sed 's/^/  /' $j.err >&2; }
kill $h1
wait $h1 2>/dev/null
wait_until 10 sh -c "[ \"\$('$TANDEM' gpu status --json | jq '[.gpus[].reservations[]] | length')\" = 0 ]" ||
    fail "reservations left: $(pids_reserved)"
finish
