# tandem generate end to end on the tiny random model (CPU): a toy adapter trained for a few
# steps answers a prompt it never saw greedily, the same way twice (byte-identical JSON) and not
# the way the bare base does; --json's shape; stop reasons; usage errors exit 2, an unreadable
# adapter exits 1 naming it.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
cd "$WORK" || exit 1
"$TANDEM" init-model tiny --preset tiny --init-std 0.1 >/dev/null || { echo "init-model failed"; exit 1; }
for i in $(seq 1 24); do echo "{\"instruction\": \"w$i\", \"response\": \"hi!\"}"; done >greet.jsonl
expect_exit 0 "$TANDEM" finetune tiny --adapter greet.jsonl:out/greet --device cpu --epochs 4 \
    --batch-size 8 --lr 3e-2 --lr-schedule constant --rank 8 \
    --targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --chat-template none \
    --save-every 0 --val-split 0
gen() { "$TANDEM" generate tiny --chat-template none --prompt "w99" --max-new-tokens 6 --json "$@"; }
expect_exit 0 gen --adapter out/greet
cp "$WORK/last.out" tuned1.json
expect_exit 0 gen --adapter out/greet
cmp -s tuned1.json "$WORK/last.out" || fail "greedy output differs between two runs"
expect_exit 0 gen
cp "$WORK/last.out" base.json
jq -e '(.text | type) == "string" and (.tokens | type) == "array" and .prompt_tokens > 0 and
       (.stop | IN("stop_token", "max_tokens", "context_full"))' tuned1.json >/dev/null ||
    fail "--json shape: $(cat tuned1.json)"
[ "$(jq -c .tokens tuned1.json)" != "$(jq -c .tokens base.json)" ] ||
    fail "the adapter answers like the base: $(cat tuned1.json)"
echo "base: $(jq -c '{text, stop}' base.json)  adapter: $(jq -c '{text, stop}' tuned1.json)"
# at most N new tokens; plain text output is the JSON's text
expect_exit 0 "$TANDEM" generate tiny --chat-template none --prompt "w99" --max-new-tokens 2 --json
[ "$(jq '.tokens | length' "$WORK/last.out")" -le 2 ] || fail "--max-new-tokens 2: $(cat "$WORK/last.out")"
expect_exit 0 "$TANDEM" generate tiny --chat-template none --prompt "w99" --max-new-tokens 6 --adapter out/greet
[ "$(cat "$WORK/last.out")" = "$(jq -r .text tuned1.json)" ] || fail "text output differs from --json's text"
# usage and runtime errors
expect_exit 2 "$TANDEM" generate tiny
expect_exit 2 "$TANDEM" generate tiny --prompt x --max-new-tokens 0
expect_exit 2 "$TANDEM" generate tiny --prompt x --method fp8
expect_exit 1 "$TANDEM" generate tiny --prompt x --adapter "$WORK/no-such-adapter"
grep -q "no-such-adapter" "$WORK/last.err" || fail "missing adapter: message does not name it: $(cat "$WORK/last.err")"
finish
