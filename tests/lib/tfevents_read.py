#!/usr/bin/env python3
"""An independent reader of TensorBoard event files, for the tests (standard library only).

Written from the format's description (docs/tensorboard.md, TFRecord and event.proto), not from
tandem's writer: CRC-32C here is the bit-by-bit loop, checked against RFC 3720's vectors at start;
the protobuf decoder is generic (any field, any wire type) and only then picks Event's fields.

Usage: tfevents_read.py RUNS_DIR          prints {"scalars": {tag: [[step, value], ...]}, "files": [...]}
       tfevents_read.py --compare OUT_DIR  checks OUT_DIR/runs against OUT_DIR/metrics.jsonl: the same
                                           steps and values (as float32) in the same order; prints
                                           "OUT_DIR: N points equal" or the differences (exit 1)
A run directory's files are read in name order, as TensorBoard does, and a SessionLog START drops
the scalars logged at steps >= its step (TensorBoard's purge of orphaned data after a restart).
Any damage (bad CRC, short record, bad protobuf, a file not starting with file_version) exits 1.
"""
import json
import os
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def check_vectors():
    # RFC 3720 appendix B.4 and the common check value
    vectors = [(b"123456789", 0xE3069283), (bytes(32), 0x8A9136AA),
               (b"\xff" * 32, 0x62A8AB43), (bytes(range(32)), 0x46DD794E),
               (bytes(range(31, -1, -1)), 0x113FDB5C)]
    for data, want in vectors:
        if crc32c(data) != want:
            sys.exit("crc32c self-check failed on %r" % data[:8])


def die(path, msg):
    print("%s: %s" % (path, msg), file=sys.stderr)
    sys.exit(1)


def records(path):
    with open(path, "rb") as f:
        blob = f.read()
    off = 0
    while off < len(blob):
        if len(blob) - off < 12:
            die(path, "torn record header at byte %d" % off)
        head = blob[off:off + 8]
        (n,) = struct.unpack("<Q", head)
        (hcrc,) = struct.unpack("<I", blob[off + 8:off + 12])
        if hcrc != masked(head):
            die(path, "bad length CRC at byte %d" % off)
        if len(blob) - off < 16 + n:
            die(path, "torn record at byte %d" % off)
        data = blob[off + 12:off + 12 + n]
        (dcrc,) = struct.unpack("<I", blob[off + 12 + n:off + 16 + n])
        if dcrc != masked(data):
            die(path, "bad data CRC at byte %d" % off)
        yield data
        off += 16 + n


def varint(buf, i):
    shift = v = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def fields(buf):
    """Yields (field number, wire type, value) for every field of a protobuf message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 1:
            v = buf[i:i + 8]
            i += 8
        elif wt == 2:
            n, i = varint(buf, i)
            v = buf[i:i + n]
            i += n
        elif wt == 5:
            v = buf[i:i + 4]
            i += 4
        else:
            raise ValueError("wire type %d" % wt)
        if i > len(buf):
            raise ValueError("truncated field %d" % num)
        yield num, wt, v


def event(data):
    ev = {"wall_time": None, "step": 0, "file_version": None, "values": [], "start": False}
    for num, wt, v in fields(data):
        if num == 1 and wt == 1:
            ev["wall_time"] = struct.unpack("<d", v)[0]
        elif num == 2 and wt == 0:
            ev["step"] = v - (1 << 64) if v >= 1 << 63 else v
        elif num == 3 and wt == 2:
            ev["file_version"] = v.decode()
        elif num == 5 and wt == 2:
            for sn, swt, sv in fields(v):
                if sn != 1 or swt != 2:
                    continue
                tag, val = None, None
                for vn, vwt, vv in fields(sv):
                    if vn == 1 and vwt == 2:
                        tag = vv.decode()
                    elif vn == 2 and vwt == 5:
                        val = struct.unpack("<f", vv)[0]
                if tag is not None and val is not None:
                    ev["values"].append((tag, val))
        elif num == 7 and wt == 2:  # Event.session_log (6 is the deprecated log_message)
            for ln, lwt, lv in fields(v):
                if ln == 1 and lwt == 0 and lv == 1:
                    ev["start"] = True
    return ev


def read_dir(d):
    names = sorted(n for n in os.listdir(d) if n.startswith("events.out.tfevents."))
    scalars = {}
    for name in names:
        path = os.path.join(d, name)
        first = True
        for data in records(path):
            try:
                ev = event(data)
            except ValueError as e:
                die(path, "bad protobuf: %s" % e)
            if first and ev["file_version"] != "brain.Event:2":
                die(path, "first record is not file_version brain.Event:2")
            first = False
            if ev["wall_time"] is None:
                die(path, "an event without wall_time")
            if ev["start"]:
                for tag in scalars:
                    scalars[tag] = [p for p in scalars[tag] if p[0] < ev["step"]]
            for tag, val in ev["values"]:
                scalars.setdefault(tag, []).append([ev["step"], val])
        if first:
            die(path, "empty event file")
    return scalars, names


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def expected(metrics_path):
    """The scalars metrics.jsonl says the event files hold (docs/tensorboard.md's table)."""
    want = {}
    seen = 0
    with open(metrics_path) as f:
        for line in f:
            m = json.loads(line)
            seen += m["tokens"]
            s = m["step"]
            if "loss" in m:
                for tag, key in (("train/loss", "loss"), ("train/learning_rate", "learning_rate"),
                                 ("train/grad_norm", "grad_norm"),
                                 ("train/tokens_per_sec", "tokens_per_sec"), ("train/epoch", "epoch")):
                    if key in m:
                        want.setdefault(tag, []).append([s, f32(m[key])])
                want.setdefault("train/tokens_seen", []).append([s, f32(seen)])
            if "val_loss" in m:
                want.setdefault("eval/loss", []).append([s, f32(m["val_loss"])])
    return want


def compare(out_dir):
    got, names = read_dir(os.path.join(out_dir, "runs"))
    want = expected(os.path.join(out_dir, "metrics.jsonl"))
    bad = 0
    for tag in sorted(set(got) | set(want)):
        g, w = got.get(tag, []), want.get(tag, [])
        if g != w:
            bad += 1
            print("%s: %s: events %s, metrics.jsonl %s" % (out_dir, tag, g[:6], w[:6]), file=sys.stderr)
    if bad or not want:
        sys.exit(1)
    print("%s: %d points equal in %d file(s)" % (out_dir, sum(len(v) for v in want.values()), len(names)))


def main():
    check_vectors()
    if sys.argv[1] == "--compare":
        for d in sys.argv[2:]:
            compare(d)
        return
    scalars, names = read_dir(sys.argv[1])
    json.dump({"scalars": scalars, "files": names}, sys.stdout)


if __name__ == "__main__":
    main()
