#!/usr/bin/env python3
"""Checks `tandem report`'s page as a browser rendered it (standard library only).

Usage: report_check.py DOM.html SHOT.png OUT_DIR...
DOM.html is chromium's --dump-dom of the page, SHOT.png its --screenshot; each OUT_DIR is an adapter
folder named on the page as given. Checks, for every adapter: each curve's data-points equal
metrics.jsonl's values; the SVG path's coordinates are those points under the chart's mapping
(data-x0/x1/y0/y1 onto data-left/top/width/height); the best-checkpoint circle sits at
trainer_state.json's best_global_step / best_metric; the leaderboard is in order of best val_loss.
And that the screenshot shows each adapter's colour. Exit 1 with the differences.
"""
import html.parser
import json
import os
import struct
import sys
import zlib

PALETTE = [(0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E), (0x2C, 0xA0, 0x2C), (0xD6, 0x27, 0x28)]
bad = []


class Dom(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.charts, self.chart, self.rows = {}, None, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg" and "plot" in a.get("class", ""):
            self.chart = {"axes": a, "paths": [], "best": []}
            self.charts[a["id"]] = self.chart
        elif tag == "path" and a.get("class") == "series":
            self.chart["paths"].append(a)
        elif tag == "circle" and a.get("class") == "best":
            self.chart["best"].append(a)
        elif tag == "tr" and "data-run" in a:
            self.rows.append(int(a["data-run"]))


def metrics(out_dir):
    want = {"train_loss": [], "val_loss": [], "learning_rate": [], "tokens_per_sec": []}
    keys = {"train_loss": "loss", "val_loss": "val_loss", "learning_rate": "learning_rate",
            "tokens_per_sec": "tokens_per_sec"}
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            for s, k in keys.items():
                if k in m:
                    want[s].append((m["step"], m[k]))
    return want


def check_path(chart, p, want):
    ax = chart["axes"]
    x0, x1, y0, y1 = (float(ax[k]) for k in ("data-x0", "data-x1", "data-y0", "data-y1"))
    left, top, w, h = (float(ax[k]) for k in ("data-left", "data-top", "data-width", "data-height"))
    pts = [(int(s), float(v)) for s, v in (t.split(",") for t in p["data-points"].split())]
    who = "%s %s" % (p["data-adapter"], p["data-series"])
    if pts != want:
        bad.append("%s: data-points %s, metrics.jsonl %s" % (who, pts[:4], want[:4]))
    coords = p["d"].replace("M", " ").replace("L", " ").split()
    xy = list(zip(map(float, coords[0::2]), map(float, coords[1::2])))
    if len(xy) != len(want):
        bad.append("%s: %d path points, %d in metrics.jsonl" % (who, len(xy), len(want)))
    for (s, v), (x, y) in zip(want, xy):
        ex = left + (s - x0) / (x1 - x0) * w
        ey = top + h - (v - y0) / (y1 - y0) * h
        if abs(ex - x) > 0.002 or abs(ey - y) > 0.002:
            bad.append("%s: step %d drawn at (%.3f, %.3f), want (%.3f, %.3f)" % (who, s, x, y, ex, ey))
            break
    return len(xy)


def png_pixels(path):
    with open(path, "rb") as f:
        blob = f.read()
    assert blob[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    off, idat, w = 8, b"", 0
    while off < len(blob):
        (n,) = struct.unpack(">I", blob[off:off + 4])
        kind, data = blob[off + 4:off + 8], blob[off + 8:off + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", data[:10])
            assert depth == 8 and ctype in (2, 6), "PNG type %d/%d" % (depth, ctype)
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += data
        off += 12 + n
    raw = zlib.decompress(idat)
    stride = w * bpp
    prev = bytearray(stride)
    counts = {}
    for r in range(h):
        ft = raw[r * (stride + 1)]
        line = bytearray(raw[r * (stride + 1) + 1:(r + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ft == 1:
                line[i] = (line[i] + a) & 255
            elif ft == 2:
                line[i] = (line[i] + b) & 255
            elif ft == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ft == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        for i in range(0, stride, bpp):
            px = (line[i], line[i + 1], line[i + 2])
            if px in PALETTE:
                counts[px] = counts.get(px, 0) + 1
        prev = line
    return counts


def main():
    dom_path, shot, dirs = sys.argv[1], sys.argv[2], sys.argv[3:]
    d = Dom()
    with open(dom_path) as f:
        d.feed(f.read())
    for need in ("chart-loss", "chart-lr", "chart-tps"):
        if need not in d.charts:
            bad.append("no %s in the rendered page" % need)
    drawn = 0
    best_of = {}
    for out_dir in dirs:
        want = metrics(out_dir)
        for cid, series in (("chart-loss", "train_loss"), ("chart-loss", "val_loss"),
                            ("chart-lr", "learning_rate"), ("chart-tps", "tokens_per_sec")):
            chart = d.charts.get(cid, {"paths": []})
            ps = [p for p in chart["paths"]
                  if p["data-adapter"] == out_dir and p["data-series"] == series]
            if len(ps) != 1:
                bad.append("%s %s: %d curves on %s" % (out_dir, series, len(ps), cid))
                continue
            drawn += check_path(chart, ps[0], want[series])
            run = int(ps[0]["data-run"])
        with open(os.path.join(out_dir, "trainer_state.json")) as f:
            ts = json.load(f)
        best_of[run] = ts["best_metric"]
        bs = [b for b in d.charts["chart-loss"]["best"] if int(b["data-run"]) == run]
        if len(bs) != 1 or int(bs[0]["data-step"]) != ts["best_global_step"] or \
                float(bs[0]["data-value"]) != ts["best_metric"]:
            bad.append("%s: best marker %s, trainer_state.json step %s val %s" %
                       (out_dir, bs, ts["best_global_step"], ts["best_metric"]))
    if d.rows != sorted(best_of, key=lambda r: best_of[r]):
        bad.append("leaderboard order %s, best val_loss %s" % (d.rows, best_of))
    counts = png_pixels(shot)
    for run in best_of:
        if counts.get(PALETTE[run], 0) < 100:
            bad.append("screenshot: adapter %d's colour on %d pixels" % (run, counts.get(PALETTE[run], 0)))
    for b in bad:
        print("FAIL:", b, file=sys.stderr)
    if bad:
        sys.exit(1)
    print("report: %d curve points in the browser's DOM equal metrics.jsonl; screenshot pixels %s" %
          (drawn, sorted(counts.values())))


main()
