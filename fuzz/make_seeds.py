#!/usr/bin/env python3
"""Writes seed corpora for the format fuzz targets (Python 3 standard library only).

  python3 fuzz/make_seeds.py [FIXTURES] [OUT]    (defaults: ../shared/fixtures, fuzz/)

Creates OUT/corpus_gguf and OUT/corpus_safetensors with small hand-made valid files (every
metadata type, nested arrays, several tensor types, custom alignment) plus the headers of
fixture files cut to 16 KiB, so the fuzzer spends its time in the parsers, not in tensor data;
and OUT/corpus_frame with pool records (frames of every flag combination the wire allows, a
rewind, a ping) in frame_fuzz's input form: 4 bytes of settings, then the records; and
OUT/corpus_model_config with the fixtures' config.json files.
"""
import json
import os
import struct
import sys


def gguf_string(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf_value(t, v):
    fmts = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q",
            11: "<q", 12: "<d"}
    if t == 8:
        return gguf_string(v)
    if t == 9:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(gguf_value(et, x) for x in items)
    return struct.pack(fmts[t], v)


def gguf(kvs, tensors, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, ne, ggml_type, nbytes)]."""
    out = struct.pack("<IIQQ", 0x46554747, 3, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += gguf_string(k) + struct.pack("<I", t) + gguf_value(t, v)
    off = 0
    for name, ne, gt, nbytes in tensors:
        out += gguf_string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", gt, off)
        off += (nbytes + alignment - 1) // alignment * alignment
    out += b"\0" * (-len(out) % alignment)
    for i, (_, _, _, nbytes) in enumerate(tensors):
        out += bytes([i + 1]) * nbytes + b"\0" * (-nbytes % alignment)
    return out


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, nbytes)]."""
    h, off = {}, 0
    if metadata:
        h["__metadata__"] = metadata
    for name, dt, shape, nbytes in tensors:
        h[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nbytes]}
        off += nbytes
    js = json.dumps(h).encode()
    js += b" " * (-(8 + len(js)) % 8)
    return struct.pack("<Q", len(js)) + js + b"\x01" * off


def record(msg_type, payload):
    # magic | version 2 (wire.h kProtocolVersion) | type | flags 0 | length | payload | checksum (frame_fuzz
    # rewrites it)
    return b"SHOL" + struct.pack("<HHII", 2, msg_type, 0, len(payload)) + payload + b"\0\0\0\0"


def frame(pos, n_tokens, flags, dtype, rows, d_model):
    # seq, pos, n-tokens, kind (prefill), flags, hop dtype (0 f32, 1 f16), reserved; then the rows
    head = struct.pack("<QIHBBB3x", 7, pos, n_tokens, 0, flags, dtype)
    return record(8, head + bytes(rows * d_model * (4 if dtype == 0 else 2)))


def frame_seeds():
    d = 8  # frame_fuzz: d_model = 1 + byte 1 % 16
    settings = bytes([0x80 | 7, d - 1, 2, 8 - 1])  # fix checksums, feed 7 bytes at a time, context 129, frame
    seeds = {}
    for flags, rows in [(0, 3), (1, 3), (2, 3), (4, 3), (2 | 8, 1), (4 | 8, 0)]:
        for dtype in (0, 1):
            seeds[f"frame_flags{flags}_dtype{dtype}"] = settings + frame(5, 3, flags, dtype, rows, d)
    seeds["frames_and_rewind"] = (settings + frame(0, 16, 4, 1, 16, d) + frame(16, 2, 2 | 8, 1, 1, d) +
                                  record(9, struct.pack("<QI", 7, 3)) + record(10, struct.pack("<QQ", 1, 2)))
    return seeds


def main():
    fixtures = sys.argv[1] if len(sys.argv) > 1 else "../shared/fixtures"
    out = sys.argv[2] if len(sys.argv) > 2 else "fuzz"
    g = os.path.join(out, "corpus_gguf")
    s = os.path.join(out, "corpus_safetensors")
    os.makedirs(g, exist_ok=True)
    os.makedirs(s, exist_ok=True)
    fr = os.path.join(out, "corpus_frame")
    os.makedirs(fr, exist_ok=True)
    for name, data in frame_seeds().items():
        open(os.path.join(fr, name), "wb").write(data)
    every = [("u8", 0, 7), ("i8", 1, -7), ("u16", 2, 700), ("i16", 3, -700), ("u32", 4, 7),
             ("i32", 5, -7), ("f32", 6, 0.5), ("bool", 7, 1), ("str", 8, "hello"),
             ("u64", 10, 2**40), ("i64", 11, -(2**40)), ("f64", 12, 0.25),
             ("arr", 9, (8, ["a", "bc", ""])),
             ("nest", 9, (9, [(4, [1, 2]), (8, ["x"])]))]
    seeds = {
        "every_type.gguf": gguf(every, [("a", [4], 0, 16), ("b", [32, 2], 8, 68), ("c", [2, 1, 1, 1], 30, 4)]),
        "aligned64.gguf": gguf([("general.alignment", 4, 64)], [("q", [32], 2, 18), ("k", [256], 12, 144)], 64),
        "v2_empty.gguf": struct.pack("<IIQQ", 0x46554747, 2, 0, 0),
    }
    for name, data in seeds.items():
        open(os.path.join(g, name), "wb").write(data)
    for rel in ["models/stories260K.gguf", "quant/q-Q4_K_M.gguf", "hf/qwen3_5_moe/model-bf16.gguf",
                "vocab/ggml-vocab-bert-bge.gguf"]:
        data = open(os.path.join(fixtures, rel), "rb").read(16384)
        open(os.path.join(g, rel.replace("/", "_")), "wb").write(data)
    st = {
        "small.safetensors": safetensors([("w", "BF16", [2, 3], 12), ("ids", "I64", [2], 16),
                                          ("s", "F32", [], 4), ("e", "F16", [0], 0)], {"format": "pt"}),
        "u8.safetensors": safetensors([("m", "U8", [4], 4)]),
    }
    for name, data in st.items():
        open(os.path.join(s, name), "wb").write(data)
    for rel in ["hf/llama/reference.safetensors", "hf/qwen3_next/model.safetensors"]:
        data = open(os.path.join(fixtures, rel), "rb").read()
        n = struct.unpack_from("<Q", data)[0]
        open(os.path.join(s, rel.replace("/", "_")), "wb").write(data[: min(len(data), 8 + n + 64)])
    mc = os.path.join(out, "corpus_model_config")
    os.makedirs(mc, exist_ok=True)
    hf = os.path.join(fixtures, "hf")
    for name in sorted(os.listdir(hf)):
        config = os.path.join(hf, name, "config.json")
        if os.path.isfile(config):
            open(os.path.join(mc, name + ".json"), "wb").write(open(config, "rb").read())
    print(f"seeds in {g}, {s}, {fr} and {mc}")


if __name__ == "__main__":
    main()
