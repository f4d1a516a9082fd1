#!/usr/bin/env python3
"""Build the tiny random llama-family GGUF models under tests/data/models/.

Dev-time only: the C++ tests never run Python, they read the committed files.

Each model is built as a real transformers model (LlamaForCausalLM, or
MistralForCausalLM for the mistral-style variant) with a fixed seed, then
written with gguf-py's GGUFWriter the way llama.cpp's convert_hf_to_gguf.py
writes a llama model:

  * llama.cpp tensor names (token_embd, blk.N.attn_q, ..., output_norm, output)
  * Q and K projection rows permuted from HF's rotate-half RoPE layout into
    GGML's "normal" (adjacent-pair, GPT-J style) layout:
        w.reshape(n_head, 2, head_dim // 2, n_in).swapaxes(1, 2).reshape(w.shape)
    (n_head_kv for K).  Weight matrices are stored as GGUF shape [n_in, n_out]
    i.e. row-major [n_out][n_in], quantization blocks run along n_in.
  * llama3 rope scaling is NOT written as metadata: like llama.cpp, the
    per-dimension factors go into a `rope_freqs.weight` F32 tensor of
    head_dim/2 entries; the engine must use theta_i = pos * base^(-2i/d) / rope_freqs[i].
    (The HF parameters are kept, for information only, under `ferry.golden.*`.)
  * 1-D tensors (norms, rope_freqs) stay F32; every 2-D tensor gets the file type.
  * a minimal byte-level GPT-2 BPE tokenizer (3 control tokens, 256 byte tokens,
    41 merges -> vocab 300).
  * tiny-mistral-sw4-f32 (same weights as tiny-mistral-f32) has a sliding window of 4,
    written as `llama.attention.sliding_window` (u32, llama.cpp's key): key j is visible
    to query i iff i - 4 < j <= i.  transformers' GGUF loader drops that key (the file
    loads as LlamaForCausalLM, which has no window), so apply_sliding_window() rebuilds
    the loaded model as MistralForCausalLM(sliding_window=4) with the loaded weights.

After writing, every file is loaded back with
transformers.AutoModelForCausalLM.from_pretrained(dir, gguf_file=...) and its
logits compared with the original in-memory HF model (this is what proves the
Q/K permutation and the tensor mapping), and with the original model whose
weights went through quantize->dequantize (this isolates layout errors from
quantization noise).  Results go to tests/data/models/manifest.json.

K-quants: gguf-py 0.19.0 can only *dequantize* Q4_K/Q5_K/Q6_K.  To still have
complete K-quant model files we encode them with the simple encoders below
(per-sub-block min/max, NOT llama.cpp's iterative quantizer; the bytes are valid
blocks, which is all that matters: the goldens come from gguf-py's dequantizer).

Usage:  python3 tools/goldens/make_tiny_models.py [--out tests/data/models]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
SEED = 1234

# Prompts (token ids) used for the load-back check; model_goldens.py uses the same.
TINY_PROMPTS = [
    [191],
    [42, 201, 124, 263, 145, 19, 256],
    [0, 194, 183, 36, 28, 159, 258, 92, 282, 135, 215, 150, 171, 232, 256, 22, 297, 216, 295, 61],
    [109, 127, 59, 166, 257, 137, 100, 283, 22, 38, 266, 274, 235, 40, 151, 208, 269, 260, 39, 236,
     60, 276, 179, 163, 221, 215, 259, 200, 154, 174, 183, 9, 184],
]

# --------------------------------------------------------------------------------------
# Tokenizer: byte-level GPT-2 BPE, trained (deterministically) on a fixed text.
# --------------------------------------------------------------------------------------

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
N_MERGES = 41  # 3 + 256 + 41 = 300
BPE_CORPUS = (
    "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun, and the fox "
    "runs into the forest. In the evening the children read their books, then they go to "
    "the garden where the flowers are in bloom. There is nothing better than a quiet "
    "evening with the ones you love. Hello world! Hello there, how are you? I am fine, "
    "thank you. This is a test of the tokenizer; it should learn the most common pairs "
    "of letters in the English language, such as th, he, in, er, an, re and on."
)
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode char map (same order as GPT-2's vocab)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def build_tokenizer() -> dict:
    import regex

    b2u = bytes_to_unicode()
    words: dict[tuple[str, ...], int] = {}
    for piece in regex.findall(GPT2_SPLIT, BPE_CORPUS):
        w = tuple(b2u[b] for b in piece.encode("utf-8"))
        words[w] = words.get(w, 0) + 1
    merges: list[tuple[str, str]] = []
    for _ in range(N_MERGES):
        pairs: dict[tuple[str, str], int] = {}
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + c
        # most frequent, ties broken lexicographically -> deterministic
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        merges.append(best)
        new_words = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] = new_words.get(tuple(out), 0) + c
        words = new_words
    tokens = SPECIAL_TOKENS + list(b2u.values()) + [a + b for a, b in merges]
    assert len(tokens) == len(set(tokens)) == 300, len(tokens)
    token_types = [3] * len(SPECIAL_TOKENS) + [1] * (len(tokens) - len(SPECIAL_TOKENS))  # 3=CONTROL, 1=NORMAL
    return {
        "tokens": tokens,
        "token_types": token_types,
        "merges": [f"{a} {b}" for a, b in merges],
        "bos_token_id": 0,
        "eos_token_id": 2,
        "padding_token_id": 0,
    }


# --------------------------------------------------------------------------------------
# Simple K-quant encoders (gguf-py 0.19.0 has no K-quant quantizer).
# Layouts follow ggml's block_q4_K / block_q5_K / block_q6_K (QK_K = 256), and are
# verified against gguf.quants.dequantize in self_test_kquants().
# --------------------------------------------------------------------------------------

QK_K = 256


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def _pack_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Pack 8 6-bit scales and 8 6-bit mins into ggml's 12-byte K_SCALE layout."""
    sc = sc.astype(np.uint8)
    mn = mn.astype(np.uint8)
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 0x3F) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (mn[:, 0:4] & 0x3F) | ((mn[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)
    return out


def _affine_subblocks(x: np.ndarray, nmax: int):
    """x: [n, 8, 32] -> (d16, dmin16, sc[n,8], mn[n,8], q[n,8,32]) for v = d*sc*q - dmin*mn."""
    lo = np.minimum(x.min(-1), 0.0)
    hi = x.max(-1)
    scale = (hi - lo) / nmax
    minv = -lo
    d16 = _f16(scale.max(-1) / 63.0)
    dmin16 = _f16(minv.max(-1) / 63.0)
    d = d16.astype(np.float32)[:, None]
    dmin = dmin16.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d > 0, np.clip(np.rint(scale / d), 0, 63), 0)
        mn = np.where(dmin > 0, np.clip(np.rint(minv / dmin), 0, 63), 0)
        eff = (d * sc)[..., None]
        q = np.where(eff > 0, np.clip(np.rint((x + (dmin * mn)[..., None]) / eff), 0, nmax), 0)
    return d16, dmin16, sc.astype(np.uint8), mn.astype(np.uint8), q.astype(np.uint8)


def quantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d16, dmin16, sc, mn, q = _affine_subblocks(blocks.reshape(n, 8, 32).astype(np.float32), 15)
    q = q.reshape(n, 4, 2, 32)
    qs = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(n, 128)
    return np.concatenate(
        [d16.view(np.uint8).reshape(n, 2), dmin16.view(np.uint8).reshape(n, 2), _pack_k_scales(sc, mn), qs], axis=1
    )


def quantize_q5_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d16, dmin16, sc, mn, q = _affine_subblocks(blocks.reshape(n, 8, 32).astype(np.float32), 31)
    ql = (q & 0x0F).reshape(n, 4, 2, 32)
    qs = (ql[:, :, 0, :] | (ql[:, :, 1, :] << 4)).reshape(n, 128)
    hbits = (q >> 4) & 1  # [n, 8, 32]
    qh = np.zeros((n, 32), dtype=np.uint8)
    for i in range(8):
        qh |= (hbits[:, i, :] << i).astype(np.uint8)
    return np.concatenate(
        [d16.view(np.uint8).reshape(n, 2), dmin16.view(np.uint8).reshape(n, 2), _pack_k_scales(sc, mn), qh, qs], axis=1
    )


def quantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    x = blocks.reshape(n, 16, 16).astype(np.float32)
    s = np.abs(x).max(-1) / 31.0  # per 16-group scale
    d16 = _f16(s.max(-1) / 127.0)
    d = d16.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d > 0, np.clip(np.rint(s / d), -128, 127), 0)
        eff = (d * sc)[..., None]
        q = np.where(eff > 0, np.clip(np.rint(x / eff), -32, 31), 0)
    u = (q + 32).astype(np.uint8).reshape(n, 2, 128)  # element h*128 + k
    ql = ((u[:, :, 0:64] & 0x0F) | ((u[:, :, 64:128] & 0x0F) << 4)).reshape(n, 128)
    u4 = u.reshape(n, 2, 4, 32)
    qh = np.zeros((n, 2, 32), dtype=np.uint8)
    for t in range(4):
        qh |= (((u4[:, :, t, :] >> 4) & 3) << (2 * t)).astype(np.uint8)
    return np.concatenate(
        [ql, qh.reshape(n, 64), sc.astype(np.int8).view(np.uint8), d16.view(np.uint8).reshape(n, 2)], axis=1
    )


K_QUANTIZERS = {"Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k}


def quantize(data: np.ndarray, qtype_name: str) -> np.ndarray:
    """float32 [rows, cols] -> raw bytes [rows, row_bytes] (or f16/f32 arrays)."""
    import gguf

    qt = gguf.GGMLQuantizationType[qtype_name]
    if qtype_name in K_QUANTIZERS:
        rows, cols = data.shape
        assert cols % QK_K == 0, (qtype_name, data.shape)
        return K_QUANTIZERS[qtype_name](data.reshape(-1, QK_K)).reshape(rows, -1)
    return gguf.quants.quantize(data.astype(np.float32), qt)


def dequantize(raw: np.ndarray, qtype_name: str) -> np.ndarray:
    import gguf

    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype_name]).astype(np.float32)


def self_test_kquants() -> dict:
    """Check our K-quant bytes decode (with gguf-py) to something close to the input."""
    rng = np.random.default_rng(7)
    res = {}
    for name, bits in (("Q4_K", 4), ("Q5_K", 5), ("Q6_K", 6)):
        x = rng.standard_normal((16, 512)).astype(np.float32) * rng.uniform(0.01, 3.0, size=(16, 1)).astype(np.float32)
        y = dequantize(quantize(x, name), name).reshape(x.shape)
        rel = float(np.sqrt(np.mean((y - x) ** 2)) / np.sqrt(np.mean(x ** 2)))
        bound = {4: 0.12, 5: 0.06, 6: 0.03}[bits]
        assert rel < bound, (name, rel)
        res[name] = rel
    return res


# --------------------------------------------------------------------------------------
# Model definitions
# --------------------------------------------------------------------------------------

SMALL = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=300, max_position_embeddings=256)
KQ = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_attention_heads=4,
          num_key_value_heads=2, head_dim=64, vocab_size=300, max_position_embeddings=256)
LLAMA3_ROPE = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=64)

# name -> (base model key, file type)
VARIANTS = [
    ("tiny-llama-f32", "llama", "F32"),
    ("tiny-llama-f16", "llama", "F16"),
    ("tiny-llama-bf16", "llama", "BF16"),
    ("tiny-llama-q8_0", "llama", "Q8_0"),
    ("tiny-llama-q4_0", "llama", "Q4_0"),
    ("tiny-llama-q4_1", "llama", "Q4_1"),
    ("tiny-llama3-f32", "llama3", "F32"),
    ("tiny-mistral-f32", "mistral", "F32"),
    ("tiny-mistral-sw4-f32", "mistral_sw4", "F32"),
    ("tiny-llama-q4_k", "llama_kq", "Q4_K"),
    ("tiny-llama-q5_k", "llama_kq", "Q5_K"),
    ("tiny-llama-q6_k", "llama_kq", "Q6_K"),
]

# Sliding window of the mistral_sw4 model: tiny, so that the prompts (up to 33 tokens) and the
# 16 generated tokens go far past it.  Stored as llama.cpp's `llama.attention.sliding_window`.
SW4_WINDOW = 4
SLIDING_WINDOW_KEY = "llama.attention.sliding_window"

FILE_TYPE = {  # gguf.LlamaFileType values, as llama.cpp writes general.file_type
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K": 15, "Q5_K": 17, "Q6_K": 18, "BF16": 32,
}


def build_hf_model(key: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    common = dict(rms_norm_eps=1e-5, attention_bias=False, mlp_bias=False, hidden_act="silu",
                  bos_token_id=0, eos_token_id=2, pad_token_id=0)
    if key == "llama":
        cfg = LlamaConfig(**SMALL, **common, tie_word_embeddings=True,
                          rope_parameters=dict(rope_type="default", rope_theta=10000.0))
        cls, seed = LlamaForCausalLM, SEED
    elif key == "llama3":
        cfg = LlamaConfig(**SMALL, **common, tie_word_embeddings=False, rope_parameters=dict(LLAMA3_ROPE))
        cls, seed = LlamaForCausalLM, SEED + 1
    elif key == "mistral":
        common = dict(common)
        common.pop("attention_bias"); common.pop("mlp_bias")
        cfg = MistralConfig(**SMALL, **common, tie_word_embeddings=False, sliding_window=4096,
                            rope_parameters=dict(rope_type="default", rope_theta=1000000.0))
        cls, seed = MistralForCausalLM, SEED + 2
    elif key == "mistral_sw4":
        # Same config and seed as "mistral" (so the same weights: the only difference is the window).
        common = dict(common)
        common.pop("attention_bias"); common.pop("mlp_bias")
        cfg = MistralConfig(**SMALL, **common, tie_word_embeddings=False, sliding_window=SW4_WINDOW,
                            rope_parameters=dict(rope_type="default", rope_theta=1000000.0))
        cls, seed = MistralForCausalLM, SEED + 2
    elif key == "llama_kq":
        cfg = LlamaConfig(**KQ, **common, tie_word_embeddings=True,
                          rope_parameters=dict(rope_type="default", rope_theta=10000.0))
        cls, seed = LlamaForCausalLM, SEED + 3
    else:
        raise KeyError(key)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    # Re-initialise everything with a dedicated generator so logits are well spread
    # (HF's default std=0.02 makes a random model's logits nearly flat -> fragile argmax).
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "model.norm.weight" and cfg.tie_word_embeddings:
                # tied: small embeddings (so the residual is not dominated by the current token's
                # embedding, which makes greedy decoding just repeat it) and a wide final norm
                # (so the logits still spread out)
                p.copy_(torch.empty(p.shape).uniform_(2.0, 4.0, generator=g))
            elif p.ndim == 1:  # RMSNorm weights: not all ones, so a missing/misplaced norm shows
                p.copy_(torch.empty(p.shape).uniform_(0.5, 1.5, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 / math.sqrt(p.shape[1])))
            elif "lm_head" in name:
                p.copy_(torch.randn(p.shape, generator=g) * (2.5 / math.sqrt(p.shape[1])))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 / math.sqrt(p.shape[1])))
    return model


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate-half layout -> GGML adjacent-pair layout (llama.cpp convert_hf_to_gguf permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(head_dim: int, p: dict) -> np.ndarray:
    """Exactly llama.cpp convert_hf_to_gguf.py LlamaModel.generate_extra_tensors."""
    base = p["rope_theta"]
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor, lo, hi, old = p["factor"], p["low_freq_factor"], p["high_freq_factor"], p["original_max_position_embeddings"]
    low_wl, high_wl = old / lo, old / hi
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (old / wl - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def gguf_tensors(model, key: str) -> list[tuple[str, np.ndarray]]:
    """HF state dict -> [(gguf name, float32 array in GGUF row layout)], llama.cpp order."""
    cfg = model.config
    sd = {k: v.detach().cpu().float().numpy() for k, v in model.state_dict().items()}
    out = []
    if key == "llama3":
        out.append(("rope_freqs.weight", llama3_rope_factors(cfg.head_dim, cfg.rope_parameters)))
    out.append(("token_embd.weight", sd["model.embed_tokens.weight"]))
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        out += [
            (f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"]),
            (f"blk.{i}.attn_q.weight", permute_rows(sd[p + "self_attn.q_proj.weight"], cfg.num_attention_heads)),
            (f"blk.{i}.attn_k.weight", permute_rows(sd[p + "self_attn.k_proj.weight"], cfg.num_key_value_heads)),
            (f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"]),
            (f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"]),
            (f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"]),
            (f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"]),
            (f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"]),
            (f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"]),
        ]
    out.append(("output_norm.weight", sd["model.norm.weight"]))
    if not cfg.tie_word_embeddings:
        out.append(("output.weight", sd["lm_head.weight"]))
    return [(n, np.ascontiguousarray(a, dtype=np.float32)) for n, a in out]


def write_gguf(path: Path, name: str, key: str, model, ftype: str, tok: dict) -> dict:
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_file_type(FILE_TYPE[ftype])
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(cfg.head_dim)
    if key == "mistral_sw4":
        w.add_sliding_window(int(cfg.sliding_window))  # u32 llama.attention.sliding_window
    if key == "llama3":
        # Informational only (llama.cpp ignores unknown keys); the engine must use rope_freqs.weight.
        p = cfg.rope_parameters
        w.add_string("ferry.golden.rope_scaling.type", "llama3")
        w.add_float32("ferry.golden.rope_scaling.factor", float(p["factor"]))
        w.add_float32("ferry.golden.rope_scaling.low_freq_factor", float(p["low_freq_factor"]))
        w.add_float32("ferry.golden.rope_scaling.high_freq_factor", float(p["high_freq_factor"]))
        w.add_uint32("ferry.golden.rope_scaling.original_context_length", int(p["original_max_position_embeddings"]))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["token_types"])
    w.add_token_merges(tok["merges"])
    w.add_bos_token_id(tok["bos_token_id"])
    w.add_eos_token_id(tok["eos_token_id"])
    w.add_pad_token_id(tok["padding_token_id"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)
    if ftype not in ("F32", "F16", "BF16"):
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    tensor_types = {}
    dequantized = {}
    for tname, arr in gguf_tensors(model, key):
        if arr.ndim == 1 or ftype == "F32":
            w.add_tensor(tname, arr)
            tensor_types[tname] = "F32"
            dequantized[tname] = arr
            continue
        raw = quantize(arr, ftype)
        if ftype == "F16":
            w.add_tensor(tname, raw)
        else:
            w.add_tensor(tname, raw, raw_dtype=gguf.GGMLQuantizationType[ftype])
        tensor_types[tname] = ftype
        dequantized[tname] = dequantize(raw, ftype).reshape(arr.shape)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"tensor_types": tensor_types, "dequantized": dequantized}


def model_from_dequantized(model, key: str, deq: dict):
    """Copy of the HF model whose weights are the (un-permuted) dequantized GGUF tensors."""
    import copy
    import torch

    m = copy.deepcopy(model)
    cfg = m.config
    sd = m.state_dict()
    new = {"model.embed_tokens.weight": deq["token_embd.weight"], "model.norm.weight": deq["output_norm.weight"]}
    if not cfg.tie_word_embeddings:
        new["lm_head.weight"] = deq["output.weight"]
    for i in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        new[p + "input_layernorm.weight"] = deq[b + "attn_norm.weight"]
        new[p + "self_attn.q_proj.weight"] = unpermute_rows(deq[b + "attn_q.weight"], cfg.num_attention_heads)
        new[p + "self_attn.k_proj.weight"] = unpermute_rows(deq[b + "attn_k.weight"], cfg.num_key_value_heads)
        new[p + "self_attn.v_proj.weight"] = deq[b + "attn_v.weight"]
        new[p + "self_attn.o_proj.weight"] = deq[b + "attn_output.weight"]
        new[p + "post_attention_layernorm.weight"] = deq[b + "ffn_norm.weight"]
        new[p + "mlp.gate_proj.weight"] = deq[b + "ffn_gate.weight"]
        new[p + "mlp.up_proj.weight"] = deq[b + "ffn_up.weight"]
        new[p + "mlp.down_proj.weight"] = deq[b + "ffn_down.weight"]
    with torch.no_grad():
        for k, v in new.items():
            sd[k].copy_(torch.from_numpy(np.ascontiguousarray(v)))
    return m


def all_logits(model, prompts=TINY_PROMPTS) -> list[np.ndarray]:
    import torch

    with torch.no_grad():
        return [model(torch.tensor([p])).logits[0].float().numpy() for p in prompts]


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return float(max(np.abs(x - y).max() for x, y in zip(a, b)))


def rms_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    d = np.concatenate([(x - y).ravel() for x, y in zip(a, b)])
    return float(np.sqrt(np.mean(d.astype(np.float64) ** 2)))


def load_back(path: Path):
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                             attn_implementation="eager")
    return m.eval()


def apply_rope_freqs(model, path: Path) -> bool:
    """transformers' GGUF loader ignores rope_freqs.weight; apply it like llama.cpp does."""
    import gguf
    import torch

    r = gguf.GGUFReader(str(path))
    t = [t for t in r.tensors if t.name == "rope_freqs.weight"]
    if not t:
        return False
    factors = torch.from_numpy(np.array(t[0].data, dtype=np.float32))
    rot = model.model.rotary_emb
    cfg = model.config
    base = float(cfg.rope_parameters["rope_theta"])
    dim = cfg.head_dim
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    rot.inv_freq = inv / factors
    rot.original_inv_freq = rot.inv_freq.clone()
    return True


def gguf_sliding_window(path: Path) -> int | None:
    """`llama.attention.sliding_window` of a GGUF file, or None."""
    import gguf

    f = gguf.GGUFReader(str(path)).get_field(SLIDING_WINDOW_KEY)
    return None if f is None else int(f.contents())


def apply_sliding_window(model, path: Path):
    """-> (model, window).  transformers 5.23's GGUF loader drops `llama.attention.sliding_window`:
    a `llama` GGUF loads as LlamaForCausalLM (no window at all), and even its `mistral` config
    mapping has no sliding_window entry.  If the file has the key, rebuild the loaded model as
    MistralForCausalLM with that window (eager attention) and the loaded (already un-permuted,
    dequantized) weights; Llama and Mistral have the same state-dict names and the same math apart
    from the mask.  Files without the key: (model, None), model untouched."""
    import torch
    from transformers import MistralConfig, MistralForCausalLM

    window = gguf_sliding_window(path)
    if window is None:
        return model, None
    c = model.config
    cfg = MistralConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, hidden_act=c.hidden_act,
                        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
                        bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id,
                        tie_word_embeddings=c.tie_word_embeddings, rope_parameters=dict(c.rope_parameters),
                        sliding_window=window)
    cfg._attn_implementation = "eager"
    m = MistralForCausalLM(cfg).to(torch.float32).eval()
    m.load_state_dict(model.state_dict(), strict=True)
    assert m.config.sliding_window == window and m.config._attn_implementation == "eager"
    return m, window


def without_window(model):
    """Copy of a Mistral model with sliding_window=None (plain causal mask): the reference for
    checking that the window matters."""
    import copy

    m = copy.deepcopy(model)
    m.config.sliding_window = None
    return m.eval()


def same_weights(a, b) -> bool:
    import torch

    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def window_diffs(with_w: list[np.ndarray], without_w: list[np.ndarray], window: int) -> dict:
    """Max |logit diff| of the rows (positions) < window and >= window, and the smallest per-row
    max diff among the rows >= window (> 0 on every row means the window changes every such row)."""
    lo, hi, row_min = 0.0, 0.0, math.inf
    for a, b in zip(with_w, without_w):
        d = np.abs(a - b).max(axis=1)
        lo = max(lo, float(d[:window].max()))
        if len(d) > window:
            hi = max(hi, float(d[window:].max()))
            row_min = min(row_min, float(d[window:].min()))
    return {"max_abs_diff_positions_lt_window": lo, "max_abs_diff_positions_ge_window": hi,
            "min_row_max_abs_diff_positions_ge_window": row_min}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "tests/data/models"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import gguf
    import torch
    import transformers

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    kq = self_test_kquants()
    print("K-quant encoder self-test (relative RMS error):", kq)
    tok = build_tokenizer()
    bases: dict[str, object] = {}
    manifest = {
        "generator": "tools/goldens/make_tiny_models.py",
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__, "gguf": _gguf_version(), "numpy": np.__version__},
        "rope_layout": "GGML normal (adjacent pairs): Q/K rows permuted like llama.cpp convert_hf_to_gguf.py",
        "kquant_encoder_self_test_rel_rms": kq,
        "models": {},
    }
    for name, key, ftype in VARIANTS:
        if key not in bases:
            bases[key] = build_hf_model(key)
        model = bases[key]
        path = out / f"{name}.gguf"
        info = write_gguf(path, name, key, model, ftype, tok)
        ref = all_logits(model)
        ref_deq = all_logits(model_from_dequantized(model, key, info["dequantized"]))
        back = load_back(path)
        loader_window = getattr(back.config, "sliding_window", None)
        loader_class = type(back).__name__
        back, window = apply_sliding_window(back, path)  # no-op for files without a window
        entry = {}
        if key == "llama3":
            entry["max_abs_diff_vs_original_without_rope_freqs"] = max_diff(ref, all_logits(back))
            assert apply_rope_freqs(back, path)
        got = all_logits(back)
        d_orig = max_diff(ref, got)
        d_deq = max_diff(ref_deq, got)
        cfg = model.config
        entry.update({
            "file": path.name,
            "bytes": path.stat().st_size,
            "hf_class": type(model).__name__,
            "loaded_back_as": type(back).__name__,
            "file_type": ftype,
            "n_layer": cfg.num_hidden_layers, "n_embd": cfg.hidden_size, "n_ff": cfg.intermediate_size,
            "n_head": cfg.num_attention_heads, "n_head_kv": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
            "n_vocab": cfg.vocab_size, "n_ctx_train": cfg.max_position_embeddings,
            "rope_theta": float(cfg.rope_parameters["rope_theta"]), "rms_norm_eps": float(cfg.rms_norm_eps),
            "tied_embeddings": bool(cfg.tie_word_embeddings),
            "rope_scaling": {k: v for k, v in cfg.rope_parameters.items()} if key == "llama3" else None,
            "tensor_types": sorted(set(info["tensor_types"].values())),
            "max_abs_logit_diff_vs_original_hf": d_orig,
            "rms_logit_diff_vs_original_hf": rms_diff(ref, got),
            "max_abs_logit_diff_vs_hf_with_dequantized_weights": d_deq,
            "max_abs_logit_original": float(max(np.abs(x).max() for x in ref)),
        })
        if window is not None:
            # The window must matter: same model without it differs on every position >= window
            # and is identical on the positions < window.
            wd = window_diffs(ref, all_logits(without_window(model)), window)
            assert wd["max_abs_diff_positions_lt_window"] == 0.0, wd
            assert wd["min_row_max_abs_diff_positions_ge_window"] > 1e-3, wd
            same_as = [n for n, k, t in VARIANTS if t == "F32" and k != key and k in bases
                       and same_weights(bases[k], model)]
            entry.update({
                "sliding_window": window,
                "sliding_window_gguf_key": SLIDING_WINDOW_KEY,
                "sliding_window_rule": f"key j visible to query i iff i - {window} < j <= i",
                "transformers_gguf_loader_class": loader_class,
                "transformers_gguf_loader_sliding_window": loader_window,
                "evaluated_as": f"{type(back).__name__}(sliding_window={window}, eager) with the loaded weights",
                "same_weights_as": same_as,
                "window_check_original_hf_vs_without_window": wd,
            })
        if key == "llama3":
            entry["rope_freqs"] = [float(x) for x in llama3_rope_factors(cfg.head_dim, cfg.rope_parameters)]
        manifest["models"][name] = entry
        print(f"{name:20s} {path.stat().st_size:8d} B  diff vs original {d_orig:.3e}  vs dequantized-weights {d_deq:.3e}")
        # Loading-back with the exact dequantized weights must be float-exact up to summation order.
        assert d_deq < 1e-3, (name, d_deq)
        if ftype == "F32":
            assert d_orig < 1e-3, (name, d_orig)
        # tokenizer round trip through transformers
        if name == "tiny-llama-f32":
            from transformers import AutoTokenizer

            t = AutoTokenizer.from_pretrained(str(out), gguf_file=path.name)
            ids = t("Hello there, the quick fox!", add_special_tokens=False)["input_ids"]
            assert t.decode(ids) == "Hello there, the quick fox!"
            manifest["tokenizer_check"] = {"text": "Hello there, the quick fox!", "ids": ids}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print("wrote", out / "manifest.json")
    return 0


def _gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")


if __name__ == "__main__":
    sys.exit(main())
