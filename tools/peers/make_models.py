#!/usr/bin/env python3
"""Model files for issue 5's benchmarks (dev-time only; ferry never runs this).

Subcommands (tools/peers/make-models.sh drives them; all output goes to the
cache directory, never the repository):

  hf-dir GGUF OUT [--dtype float16|float32]
      A Hugging Face model directory (config.json, model.safetensors,
      tokenizer files) from a llama-family GGUF, through transformers' GGUF
      loader (it dequantizes). llama.cpp's convert_hf_to_gguf.py and mlx-lm
      both read such a directory. The weights are the GGUF's dequantized
      values: made from SmolLM2's Q4_1 file, an "F16" or "Q8_0" model carries
      Q4_1's rounding error. Same speed as the original, not its quality.

  random-llama OUT.gguf --vocab-from GGUF [--seed 0] [shape flags]
      A Llama-3.2-1B-shaped model with random weights, written as an F16 GGUF
      with gguf-py (PYTHONPATH picks the pinned copy from the llama.cpp sdist).
      Llama 3 RoPE scaling is stored the way llama.cpp's converter stores it:
      a rope_freqs.weight tensor of per-frequency divisors. The tokenizer is
      the other GGUF's byte-level BPE vocabulary, padded with unused tokens to
      the vocabulary size. Random weights measure speed only.

  hf-from-random GGUF OUT
      The same random model as an HF directory (float16) for mlx-lm: the
      GGUF's tensors renamed, Q/K rows un-permuted, plus a config.json and
      the vocabulary-donor's tokenizer files copied from --tokenizer-dir.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np


# ------------------------------------------------------------------ hf-dir

def hf_dir(args: argparse.Namespace) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(args.gguf).resolve()
    out = Path(args.out)
    dtype = {"float16": torch.float16, "float32": torch.float32}[args.dtype]
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype)
    # The weights are already dequantized tensors; the GGUF "quantizer" only
    # marks the model unserializable, and its config entry would make later
    # readers look for a GGUF file again.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    cfg = json.loads((tmp / "config.json").read_text())
    cfg.pop("quantization_config", None)
    # transformers 5 writes RoPE settings only as `rope_parameters`; readers
    # of the older layout (mlx-lm's llama.py) would silently fall back to
    # theta 10000. Write both.
    rope = cfg.get("rope_parameters") or {}
    if "rope_theta" in rope:
        cfg["rope_theta"] = rope["rope_theta"]
    if rope.get("rope_type", "default") != "default":
        cfg["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(out)


# ------------------------------------------------------------ random-llama

def llama3_rope_divisors(head_dim: int, theta: float, factor: float, low: float,
                         high: float, original_ctx: int) -> np.ndarray:
    """Per-frequency divisors of Llama 3's RoPE scaling (what llama.cpp's
    converter writes as rope_freqs.weight): 1 for high frequencies, `factor`
    for low ones, a smooth blend between."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    low_wavelen = original_ctx / low
    high_wavelen = original_ctx / high
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def random_llama(args: argparse.Namespace) -> None:
    import gguf

    donor = gguf.GGUFReader(args.vocab_from)

    def field(name):
        f = donor.fields.get(name)
        return None if f is None else f.contents()

    tokens = list(field("tokenizer.ggml.tokens"))
    types = list(field("tokenizer.ggml.token_type"))
    if len(tokens) > args.vocab:
        sys.exit(f"random-llama: donor vocabulary ({len(tokens)}) is larger than --vocab")
    for i in range(len(tokens), args.vocab):
        tokens.append(f"<|ferry_pad_{i}|>")
        types.append(int(gguf.TokenType.UNUSED))

    hd = args.hidden // args.heads
    tmp = args.out + ".part"
    w = gguf.GGUFWriter(tmp, "llama")
    w.add_name("ferry-random-llama-3.2-1b-shape")
    w.add_context_length(args.ctx)
    w.add_embedding_length(args.hidden)
    w.add_block_count(args.layers)
    w.add_feed_forward_length(args.ffn)
    w.add_head_count(args.heads)
    w.add_head_count_kv(args.kv_heads)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(args.rope_theta)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(args.vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(field("tokenizer.ggml.pre") or "smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(field("tokenizer.ggml.merges")))
    for key, add in (("tokenizer.ggml.bos_token_id", w.add_bos_token_id),
                     ("tokenizer.ggml.eos_token_id", w.add_eos_token_id),
                     ("tokenizer.ggml.padding_token_id", w.add_pad_token_id)):
        v = field(key)
        if v is not None:
            add(int(v))
    w.add_add_bos_token(False)

    rng = np.random.default_rng(args.seed)

    def normal(rows: int, cols: int, std: float) -> np.ndarray:
        # numpy order (rows, cols) = GGUF ne (cols, rows): rows are outputs.
        return (rng.standard_normal((rows, cols), dtype=np.float32) * std).astype(np.float16)

    std = 0.02
    # Residual-branch outputs scaled down with depth so activations stay
    # finite across 16 layers (GPT-2's 1/sqrt(2L) init).
    std_out = std / math.sqrt(2 * args.layers)
    kv = args.kv_heads * hd
    w.add_tensor("token_embd.weight", normal(args.vocab, args.hidden, std))
    w.add_tensor("output_norm.weight", np.ones(args.hidden, dtype=np.float32))
    w.add_tensor("rope_freqs.weight", llama3_rope_divisors(
        hd, args.rope_theta, 32.0, 1.0, 4.0, 8192))
    for i in range(args.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(args.hidden, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", normal(args.hidden, args.hidden, std))
        w.add_tensor(p + "attn_k.weight", normal(kv, args.hidden, std))
        w.add_tensor(p + "attn_v.weight", normal(kv, args.hidden, std))
        w.add_tensor(p + "attn_output.weight", normal(args.hidden, args.hidden, std_out))
        w.add_tensor(p + "ffn_norm.weight", np.ones(args.hidden, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", normal(args.ffn, args.hidden, std))
        w.add_tensor(p + "ffn_up.weight", normal(args.ffn, args.hidden, std))
        w.add_tensor(p + "ffn_down.weight", normal(args.hidden, args.ffn, std_out))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    os.replace(tmp, args.out)
    print(args.out)


# ---------------------------------------------------------- hf-from-random

def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's converter permutation of Q/K rows (HF stores
    each head's rotary pairs as halves; GGUF interleaves them)."""
    rows = w.shape[0]
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
             .swapaxes(1, 2).reshape(w.shape))


def hf_from_random(args: argparse.Namespace) -> None:
    import gguf
    from safetensors.numpy import save_file

    r = gguf.GGUFReader(args.gguf)

    def val(key):
        return r.fields[key].contents()

    hidden = int(val("llama.embedding_length"))
    heads = int(val("llama.attention.head_count"))
    kv_heads = int(val("llama.attention.head_count_kv"))
    layers = int(val("llama.block_count"))
    t = {x.name: x for x in r.tensors}

    def arr(name):
        x = t[name]
        if x.tensor_type not in (gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32):
            sys.exit(f"hf-from-random: {name} is {x.tensor_type.name}; give the F16 file")
        shape = tuple(int(d) for d in reversed(x.shape.tolist()))
        return np.asarray(x.data).reshape(shape).astype(np.float16)

    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    sd = {"model.embed_tokens.weight": arr("token_embd.weight"),
          "model.norm.weight": arr("output_norm.weight")}
    for i in range(layers):
        for g, h in names.items():
            a = arr(f"blk.{i}.{g}.weight")
            if g == "attn_q":
                a = unpermute(a, heads)
            elif g == "attn_k":
                a = unpermute(a, kv_heads)
            sd[f"model.layers.{i}.{h}.weight"] = np.ascontiguousarray(a)
    out = Path(args.out)
    tmp = out.with_name(out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": hidden, "intermediate_size": int(val("llama.feed_forward_length")),
        "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": hidden // heads,
        "vocab_size": len(r.fields["tokenizer.ggml.tokens"].data),
        "max_position_embeddings": int(val("llama.context_length")),
        "rms_norm_eps": float(val("llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(val("llama.rope.freq_base")),
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "tie_word_embeddings": True, "hidden_act": "silu", "torch_dtype": "float16",
        "attention_bias": False, "mlp_bias": False,
        "bos_token_id": int(val("tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(val("tokenizer.ggml.eos_token_id")),
    }
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in Path(args.tokenizer_dir).iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            shutil.copy(f, tmp / f.name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("hf-dir")
    a.add_argument("gguf")
    a.add_argument("out")
    a.add_argument("--dtype", default="float32", choices=["float16", "float32"])
    a.set_defaults(func=hf_dir)
    b = sub.add_parser("random-llama")
    b.add_argument("out")
    b.add_argument("--vocab-from", required=True)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--hidden", type=int, default=2048)
    b.add_argument("--layers", type=int, default=16)
    b.add_argument("--heads", type=int, default=32)
    b.add_argument("--kv-heads", type=int, default=8)
    b.add_argument("--ffn", type=int, default=8192)
    b.add_argument("--vocab", type=int, default=128256)
    b.add_argument("--ctx", type=int, default=131072)
    b.add_argument("--rope-theta", type=float, default=500000.0)
    b.set_defaults(func=random_llama)
    c = sub.add_parser("hf-from-random")
    c.add_argument("gguf")
    c.add_argument("out")
    c.add_argument("--tokenizer-dir", required=True)
    c.set_defaults(func=hf_from_random)
    args = ap.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
