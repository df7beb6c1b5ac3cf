# make run's adapters learn (issue 13 item 20), on the CPU:
#   - one adapter memorises a constant answer: "hi!" after any word, AdamW at a constant 2e-3 (the
#     demo's rate), rank 8 on all seven projections, 3 epochs of 8 steps: the loss logged at step
#     24 is below 0.05 and the greedy answer to a word not in the data is "hi!" (a trainer whose
#     optimizer state, clipping or schedule went wrong over many steps fails here; the golden
#     tests check 4 steps against PEFT);
#   - scripts/demo-adapters.sh (what make run shows) exits 0, every held-out answer it shows is
#     right, each adapter answers at least 90% of its 30 held-out prompts right, and each one's
#     logged training loss falls at least tenfold. The demo's earlier settings (learning rate
#     3e-2, 64 lines, 96 steps) fail here: 5 of its 6 shown answers were wrong.
# TANDEM_DEMO_SCRIPT runs another demo script through the same checks.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
cd "$WORK" || exit 1
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

"$TANDEM" init-model tiny --preset tiny --init-std 0.1 >/dev/null || { echo "init-model failed"; exit 1; }
for i in $(seq 1 64); do echo "{\"instruction\": \"w$i\", \"response\": \"hi!\"}"; done >greet.jsonl
expect_exit 0 "$TANDEM" finetune tiny --adapter greet.jsonl:out/greet --device cpu --epochs 3 \
    --batch-size 8 --lr 2e-3 --lr-schedule constant --rank 8 \
    --targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --chat-template none \
    --log-every 8 --save-every 0 --val-split 0 --no-join
jq -c 'select(.loss) | [.step, .loss]' out/greet/metrics.jsonl | tr '\n' ' '; echo
jq -se '[.[] | select(.loss)] | last | .step == 24 and .loss < 0.05' out/greet/metrics.jsonl >/dev/null ||
    fail "a constant answer is not memorised in 24 steps: $(jq -c 'select(.loss) | [.step, .loss]' out/greet/metrics.jsonl | tr '\n' ' ')"
expect_exit 0 "$TANDEM" generate tiny --device cpu --chat-template none --prompt w999 \
    --max-new-tokens 6 --adapter out/greet --json
[ "$(jq -r .text "$WORK/last.out")" = "hi!" ] || fail "held-out answer: $(cat "$WORK/last.out")"

demo=${TANDEM_DEMO_SCRIPT:-$TANDEM_SOURCE_DIR/scripts/demo-adapters.sh}
TANDEM_DEMO_REPORT="$WORK/report.html" "$demo" "$TANDEM" >demo.out 2>&1
rc=$?
cat demo.out
[ $rc = 0 ] || fail "$demo exited $rc"
shown=$(grep -cE '\((right|wrong)\)$' demo.out)
[ "$shown" -ge 6 ] || fail "the demo shows $shown answers, not 2 per adapter"
grep -qE '\(wrong\)$' demo.out && fail "the demo shows a wrong answer: $(grep -E '\(wrong\)$' demo.out)"
line=$(grep 'held-out prompts answered right:' demo.out) || fail "no held-out score line"
for a in greet last parity; do
    n=$(sed -E "s|.* $a ([0-9]+)/30.*|\1|" <<<"$line")
    [ "${n:-0}" -ge 27 ] 2>/dev/null || fail "$a: $n of 30 held-out prompts right (want >= 27)"
    losses=$(grep -E "^   $a +[0-9]" demo.out | head -n1)
    read -r _ first rest <<<"$losses"
    last=${rest##* }
    awk -v f="$first" -v l="${last:-$first}" 'BEGIN { exit !(f > 0 && l * 10 < f) }' ||
        fail "$a: training loss $first -> $last did not fall tenfold"
done
finish
