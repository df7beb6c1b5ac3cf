# `tandem report` (docs/report.md), checked in a real headless browser (Debian's chromium):
#  - a finetune of two adapters ends with "report: tandem report OUT_DIR..."; that command (and the
#    parent folder, and a `cluster pull --all`-shaped DEST) writes one self-contained page: no
#    script, no link, nothing fetched;
#  - chromium renders it: in its DOM every curve's points equal metrics.jsonl, the SVG path's
#    coordinates are those points under the chart's axes, the best checkpoint circle sits at
#    trainer_state.json's best step and loss, the leaderboard is in best-val_loss order; its
#    screenshot shows both adapters' colours (tests/lib/report_check.py);
#  - mistakes: no OUT_DIR (usage), a folder without run records, a damaged metrics.jsonl line.
# The browser part skips (exit 77, with the reason) only when chromium is not installed.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
M="$WORK/tiny"
"$TANDEM" init-model "$M" --preset tiny >/dev/null || { echo "init-model failed"; exit 1; }
"$TANDEM_SOURCE_DIR/scripts/make-demo-data.sh" "$WORK/data" 8
cd "$WORK" || exit 1
expect_exit 0 "$TANDEM" finetune "$M" --adapter data/reverse.jsonl:o/rev \
    --adapter data/add.jsonl:o/add --batch-size 2 --epochs 2 --val-split 0.25 --log-every 1 \
    --eval-every 2 --save-every 0 --max-seq-len 48 --seed 7 --device cpu --no-join
tail -n 1 last.out | grep -qx "report: tandem report o/rev o/add" ||
    fail "finetune's last line: $(tail -n 1 last.out)"

expect_exit 0 "$TANDEM" report o/rev o/add -o r.html
grep -qx "report: r.html (2 adapters)" last.out || fail "report output: $(cat last.out)"
grep -qiE "<script|src=|href=|url\(|@import|https?:" r.html && fail "the page fetches or runs something"
# a parent folder is its OUT_DIRs in name order; a pulled DEST (DEST/adapter-N) reads the same
expect_exit 0 "$TANDEM" report o
expect_exit 0 "$TANDEM" report o/add o/rev -o sorted.html
cmp -s report.html sorted.html || fail "report o differs from report o/add o/rev"
mkdir -p pulled && cp -r o/rev pulled/adapter-1 && cp -r o/add pulled/adapter-2
expect_exit 0 "$TANDEM" report pulled -o pulled.html
[ "$(grep -c 'class="series"' pulled.html)" -eq 8 ] || fail "pulled: not 8 curves"

# mistakes
expect_exit 2 "$TANDEM" report
mkdir empty
expect_exit 1 "$TANDEM" report empty
grep -q "empty: no metrics.jsonl in it or in its subfolders" last.err || fail "empty: $(cat last.err)"
# a folder that does not exist is not called empty
expect_exit 1 "$TANDEM" report o/rev missing -o r3.html
grep -qx "tandem: missing does not exist: give an adapter's OUT_DIR" last.err || fail "missing: $(cat last.err)"
[ -e r3.html ] && fail "missing: r3.html written"
# -o naming a directory is refused up front, nothing written (it failed renaming the temp file)
mkdir rep
for o in rep/ rep; do
    expect_exit 2 "$TANDEM" report o/rev -o $o
    grep -qx "tandem: -o $o is a directory: give the HTML file's name, e.g. rep/report.html" last.err ||
        fail "-o $o: $(cat last.err)"
done
expect_exit 2 "$TANDEM" report o/rev -o new/
grep -q "^tandem: -o new/ is a directory" last.err || fail "-o new/: $(cat last.err)"
[ -z "$(ls -A rep)" ] && ! [ -e new ] && ! ls -A | grep -q '\.tmp-' || fail "-o DIR wrote: $(ls -A . rep)"
mkdir -p broken && cp o/add/metrics.jsonl broken/ && echo '{"step": ' >>broken/metrics.jsonl
n=$(wc -l <broken/metrics.jsonl)
expect_exit 1 "$TANDEM" report broken
grep -q "broken/metrics.jsonl:$n: not a metrics line" last.err || fail "broken: $(cat last.err)"
# -o into a directory that does not exist names that directory, not the temp file
expect_exit 1 "$TANDEM" report o/add -o nodir/x.html
grep -q "^tandem: cannot write nodir/x.html: directory nodir does not exist (create it first)$" last.err ||
    fail "-o nodir/x.html: $(cat last.err)"
[ -e nodir ] && fail "-o nodir/x.html: nodir was made"

if ! command -v chromium >/dev/null 2>&1; then
    echo "skipped: chromium is not installed (scripts/install-deps.sh installs it where it can)"
    [ "$FAILURES" -eq 0 ] && exit 77
    finish
fi
CHROME=(chromium --headless --no-sandbox --disable-gpu --user-data-dir="$WORK/chrome"
        --no-first-run --disable-extensions)
"${CHROME[@]}" --dump-dom "file://$WORK/r.html" >dom.html 2>chrome.err || fail "chromium --dump-dom: $(tail -3 chrome.err)"
"${CHROME[@]}" --window-size=900,1700 --screenshot="$WORK/shot.png" "file://$WORK/r.html" \
    >/dev/null 2>>chrome.err || fail "chromium --screenshot: $(tail -3 chrome.err)"
python3 "$TANDEM_SOURCE_DIR/tests/lib/report_check.py" dom.html shot.png o/rev o/add ||
    fail "the rendered page does not show metrics.jsonl"
finish
