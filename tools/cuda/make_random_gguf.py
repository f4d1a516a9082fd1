#!/usr/bin/env python3
"""Writes a llama-architecture GGUF with random weights, from a seed, for
speed measurements only (random weights say nothing about quality).

Needs only numpy, so it runs on a GPU machine that cannot install packages
(a 16 GB model is too large to copy there). Tensors are written in parallel,
one process per tensor, at offsets computed up front.

  make_random_gguf.py OUT.gguf [--shape llama-3.1-8b] [--type bf16|q8_0|q4_k_m]
                               [--seed 0] [--layers N]

Shapes: llama-3.1-8b (32 layers, hidden 4096, 32 heads, 8 KV heads, FFN
14336, vocab 128256), llama-3.2-1b, smollm2-135m.
Types: bf16 (every matrix bf16); q8_0; q4_k_m (llama.cpp's Q4_K_M recipe:
Q4_K, with Q6_K for the output head and for attn_v / ffn_down in the first
and last eighth of the layers and every third layer between).

The vocabulary is synthetic (256 byte tokens in GPT-2's byte-to-unicode
spelling, then <|tN|> control tokens; no merges), enough for ferry's and
llama.cpp's tokenizers to load it.
"""
import argparse
import multiprocessing as mp
import os
import struct

import numpy as np

SHAPES = {
    "llama-3.1-8b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256,
                         rope_theta=500000.0, ctx=8192),
    "llama-3.2-1b": dict(layers=16, hidden=2048, heads=32, kv_heads=8, ffn=8192, vocab=128256,
                         rope_theta=500000.0, ctx=8192),
    "smollm2-135m": dict(layers=30, hidden=576, heads=9, kv_heads=3, ffn=1536, vocab=49152,
                         rope_theta=100000.0, ctx=8192),
}

# GGML type ids and block layouts: (elements per block, bytes per block).
F32, BF16, Q8_0, Q4_K, Q6_K = 0, 30, 8, 12, 14
BLOCK = {F32: (1, 4), BF16: (1, 2), Q8_0: (32, 34), Q4_K: (256, 144), Q6_K: (256, 210)}
ALIGN = 32

# GGUF metadata value types.
T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9


def gguf_string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key: str, vtype: int, value) -> bytes:
    out = gguf_string(key) + struct.pack("<I", vtype)
    if vtype == T_UINT32:
        out += struct.pack("<I", value)
    elif vtype == T_INT32:
        out += struct.pack("<i", value)
    elif vtype == T_FLOAT32:
        out += struct.pack("<f", value)
    elif vtype == T_BOOL:
        out += struct.pack("<?", value)
    elif vtype == T_STRING:
        out += gguf_string(value)
    elif vtype == T_ARRAY:
        etype, items = value
        out += struct.pack("<IQ", etype, len(items))
        if etype == T_STRING:
            out += b"".join(gguf_string(x) for x in items)
        elif etype == T_INT32:
            out += np.asarray(items, dtype="<i4").tobytes()
    return out


def byte_tokens() -> list:
    # GPT-2's byte-to-unicode table: printable bytes map to themselves.
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


def tensor_type(name: str, layer: int, n_layers: int, kind: str) -> int:
    if name.endswith("norm.weight"):
        return F32
    if kind == "bf16":
        return BF16
    if kind == "q8_0":
        return Q8_0
    # q4_k_m: llama.cpp's use_more_bits(i, n) rule for attn_v and ffn_down.
    more = layer >= 0 and (layer < n_layers // 8 or layer >= 7 * n_layers // 8 or
                           (layer - n_layers // 8) % 3 == 2)
    if name == "output.weight" or (more and (name.endswith("attn_v.weight") or
                                             name.endswith("ffn_down.weight"))):
        return Q6_K
    return Q4_K


def fill(job):
    """Writes one tensor's random bytes at its offset (runs in a worker)."""
    path, offset, ttype, n_in, n_out, seed = job
    rng = np.random.default_rng(seed)
    epb, bpb = BLOCK[ttype]
    if ttype == F32:  # norm weights: ones, as a trained model's are near 1
        data = np.ones(n_in * n_out, dtype="<f4").tobytes()
    elif ttype == BF16:
        # Random sign and mantissa, exponent of 2^-7: values of magnitude
        # 0.008-0.016, so activations stay finite through 32 layers.
        bits = rng.integers(0, 1 << 16, size=n_in * n_out, dtype=np.uint16)
        data = ((bits & 0x807F) | 0x3C00).astype("<u2").tobytes()
    else:
        blocks = rng.integers(0, 256, size=(n_in * n_out // epb, bpb), dtype=np.uint8)
        small = np.frombuffer(np.float16(0.0005).tobytes(), dtype=np.uint8)
        if ttype == Q8_0:
            blocks[:, 0:2] = small  # d
        elif ttype == Q4_K:
            blocks[:, 0:2] = small  # d
            blocks[:, 2:4] = small  # dmin
        elif ttype == Q6_K:
            blocks[:, 208:210] = small  # d (last)
        data = blocks.tobytes()
    fd = os.open(path, os.O_WRONLY)
    try:
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset)
            view = view[n:]
            offset += n
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--type", default="bf16", choices=["bf16", "q8_0", "q4_k_m"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=0, help="override the layer count")
    args = ap.parse_args()
    s = dict(SHAPES[args.shape])
    if args.layers:
        s["layers"] = args.layers
    L, E, H, KVH, F, V = (s[k] for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab"))
    D = E // H

    tensors = [("token_embd.weight", -1, E, V), ("output_norm.weight", -1, E, 1),
               ("output.weight", -1, E, V)]
    for l in range(L):
        p = f"blk.{l}."
        tensors += [(p + "attn_norm.weight", l, E, 1), (p + "attn_q.weight", l, E, H * D),
                    (p + "attn_k.weight", l, E, KVH * D), (p + "attn_v.weight", l, E, KVH * D),
                    (p + "attn_output.weight", l, H * D, E), (p + "ffn_norm.weight", l, E, 1),
                    (p + "ffn_gate.weight", l, E, F), (p + "ffn_up.weight", l, E, F),
                    (p + "ffn_down.weight", l, F, E)]

    tokens = byte_tokens() + [f"<|t{i}|>" for i in range(V - 256)]
    types = [1] * 256 + [3] * (V - 256)  # normal, then control
    meta = [
        kv("general.architecture", T_STRING, "llama"),
        kv("general.name", T_STRING, f"ferry-random-{args.shape}-{args.type}-seed{args.seed}"),
        kv("general.alignment", T_UINT32, ALIGN),
        kv("llama.context_length", T_UINT32, s["ctx"]),
        kv("llama.embedding_length", T_UINT32, E),
        kv("llama.block_count", T_UINT32, L),
        kv("llama.feed_forward_length", T_UINT32, F),
        kv("llama.attention.head_count", T_UINT32, H),
        kv("llama.attention.head_count_kv", T_UINT32, KVH),
        kv("llama.rope.dimension_count", T_UINT32, D),
        kv("llama.rope.freq_base", T_FLOAT32, s["rope_theta"]),
        kv("llama.attention.layer_norm_rms_epsilon", T_FLOAT32, 1e-5),
        kv("llama.vocab_size", T_UINT32, V),
        kv("tokenizer.ggml.model", T_STRING, "gpt2"),
        kv("tokenizer.ggml.pre", T_STRING, "default"),
        kv("tokenizer.ggml.tokens", T_ARRAY, (T_STRING, tokens)),
        kv("tokenizer.ggml.token_type", T_ARRAY, (T_INT32, types)),
        kv("tokenizer.ggml.merges", T_ARRAY, (T_STRING, [])),
        kv("tokenizer.ggml.bos_token_id", T_UINT32, 256),
        kv("tokenizer.ggml.eos_token_id", T_UINT32, 257),
    ]

    infos, jobs, offset = [], [], 0
    for i, (name, layer, n_in, n_out) in enumerate(tensors):
        t = tensor_type(name, layer, L, args.type)
        epb, bpb = BLOCK[t]
        dims = [n_in] if n_out == 1 else [n_in, n_out]
        infos.append(gguf_string(name) + struct.pack("<I", len(dims)) +
                     b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", t, offset))
        jobs.append([t, n_in, n_out, offset, args.seed * 100003 + i])
        offset += (n_in * n_out // epb * bpb + ALIGN - 1) // ALIGN * ALIGN

    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)) + b"".join(meta) + \
        b"".join(infos)
    data_start = (len(header) + ALIGN - 1) // ALIGN * ALIGN
    with open(args.out, "wb") as f:
        f.write(header + b"\0" * (data_start - len(header)))
        f.truncate(data_start + offset)
    work = [(args.out, data_start + off, t, n_in, n_out, seed) for t, n_in, n_out, off, seed in jobs]
    # Largest first, so the pool's tail is short.
    work.sort(key=lambda j: -(j[3] * j[4]))
    with mp.Pool(min(16, os.cpu_count() or 1)) as pool:
        pool.map(fill, work, chunksize=1)
    print(f"{args.out}: {len(tensors)} tensors, {(data_start + offset) / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
