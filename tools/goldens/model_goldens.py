#!/usr/bin/env python3
"""Reference logits / greedy continuations for the tiny models and SmolLM2.

Dev-time only.  Every model is loaded *from its GGUF file* by transformers
(`AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=float32)`;
transformers dequantizes with gguf-py and undoes llama.cpp's Q/K permutation),
so the goldens are an implementation independent of ferry.

Greedy decoding is a plain loop of full forwards (no KV cache, no sampling, no
repetition penalty, EOS ignored): at step k the model sees prompt + the k tokens
generated so far and the next token is argmax of the last row (ties -> lowest id,
torch.argmax semantics).

Outputs (format described in tools/goldens/README.md):
  tests/data/goldens/<tiny-model>.json + .bin   (for every tests/data/models/*.gguf)
                                                (sliding-window models: + window checks)
  tests/data/goldens/smollm2.json + .bin        (SmolLM2-135M-Instruct.Q4_1.gguf)

Usage:
  python3 tools/goldens/model_goldens.py [--tiny-only | --smollm-only]
         [--smollm PATH]   (default $HOME/.cache/ferry/models/SmolLM2-135M-Instruct.Q4_1.gguf)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_tiny_models import (TINY_PROMPTS, apply_rope_freqs, apply_sliding_window,  # noqa: E402
                              window_diffs, without_window)

REPO = HERE.parents[1]
MODELS = REPO / "tests/data/models"
GOLDENS = REPO / "tests/data/goldens"
SMOLLM_DEFAULT = Path.home() / ".cache/ferry/models/SmolLM2-135M-Instruct.Q4_1.gguf"

TINY_N_GEN = 16
SMOLLM_N_GEN = 32
TOPK = 5
SUBSET_STRIDE = 48  # 49152 / 48 = 1024 ids: 0, 48, 96, ..., 49104

SMOLLM_PLAIN_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    return",
    "In 2024, the population was 1234567 people and",
    "Ünïcödé text: 日本語 and emoji 🙂 are",
]
SMOLLM_CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
# Extra text -> ids pairs for tokenizer tests (no trailing whitespace: llama.cpp's smollm
# regex lacks GPT-2's final `|\s+` alternative, so trailing blanks could legitimately differ).
SMOLLM_TOKENIZER_TEXTS = [
    "Hello world!",
    "Hello, my name is SmolLM and I'm 135M parameters.",
    "  two leading spaces and\ttabs\n\nnewlines",
    "Numbers: 3.14159, -42, 1e10, 007",
    "I've, you'll, he'd, they're, it's DON'T",
    "naïve café résumé — “quotes” ‘single’ …",
    "中文字符 русский текст العربية",
    "emoji: 👍🏽 🇫🇷 ❤️",
    "<|im_start|>user\nhi<|im_end|>",
    "x = {\"key\": [1, 2, 3]}  # comment",
]


def versions() -> dict:
    import platform
    from importlib.metadata import version

    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "gguf": version("gguf"),
            "tokenizers": version("tokenizers"), "numpy": np.__version__}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load(path: Path):
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                             attn_implementation="eager").eval()
    patched = apply_rope_freqs(m, path)  # llama3: transformers ignores rope_freqs.weight
    # llama.attention.sliding_window: transformers' GGUF loader drops it -> rebuild as
    # MistralForCausalLM(sliding_window=W) with the loaded weights (no-op without the key).
    m, window = apply_sliding_window(m, path)
    return m, patched, window


def check_window_mask(model, n: int, window: int) -> dict:
    """Capture the mask that Mistral's eager attention really receives on an n-token forward and
    check that key j is visible to query i iff i - window < j <= i, with all n keys present."""
    import torch
    import transformers.models.mistral.modeling_mistral as mm

    seen = []
    orig = mm.eager_attention_forward

    def spy(module, query, key, value, attention_mask, *a, **kw):
        seen.append((attention_mask.detach().clone(), key.shape[-2]))
        return orig(module, query, key, value, attention_mask, *a, **kw)

    mm.eager_attention_forward = spy
    try:
        with torch.no_grad():
            model(torch.arange(3, 3 + n)[None])
    finally:
        mm.eager_attention_forward = orig
    assert len(seen) == model.config.num_hidden_layers, len(seen)
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    want = (i - window < j) & (j <= i)
    for mask, kv_len in seen:
        assert kv_len == n and tuple(mask.shape[-2:]) == (n, n), (kv_len, mask.shape)
        m = mask[0, 0].float().numpy()
        assert np.all(m[want] == 0.0) and np.all(m[~want] <= torch.finfo(torch.float32).min), "window rule"
    return {"rule": f"key j visible to query i iff i - {window} < j <= i",
            "checked_on": f"additive masks passed to MistralForCausalLM eager attention, every layer, {n}-token forward",
            "ok": True}


def greedy(model, prompt: list[int], n_gen: int):
    """-> (generated ids, rows [L + n_gen - 1, V] float32): rows 0..L-1 are the prompt positions
    (from the first forward), row L-1+k (k >= 1) is the last row of the forward at step k."""
    import torch

    seq = list(prompt)
    rows = []
    gen = []
    with torch.no_grad():
        for k in range(n_gen):
            logits = model(torch.tensor([seq])).logits[0].float().numpy()
            if k == 0:
                rows.extend(logits)
            else:
                rows.append(logits[-1])
            nxt = int(np.argmax(logits[-1]))
            gen.append(nxt)
            seq.append(nxt)
    return gen, np.stack(rows).astype(np.float32)


def topk_rows(rows: np.ndarray, k: int = TOPK):
    idx = np.argsort(-rows, axis=1, kind="stable")[:, :k]
    vals = np.take_along_axis(rows, idx, axis=1)
    return idx, vals


def margins(summ: dict, L: int) -> dict:
    """top1 - top2 gaps: over all rows, and over the rows that chose a generated token (L-1..)."""
    gaps = [v[0] - v[1] for v in summ["top5_values"]]
    return {"min_top1_top2_margin": f32(min(gaps)), "min_gen_margin": f32(min(gaps[L - 1:]))}


def f32(x) -> float:
    """float32 value as a JSON number that round-trips exactly (%.9g)."""
    return float("%.9g" % float(np.float32(x)))


class BinWriter:
    def __init__(self):
        self.chunks: list[bytes] = []
        self.size = 0

    def add(self, arr: np.ndarray) -> dict:
        a = np.ascontiguousarray(arr, dtype="<f4")
        off = self.size
        b = a.tobytes()
        self.chunks.append(b)
        self.size += len(b)
        return {"offset": off, "shape": list(a.shape)}

    def write(self, path: Path):
        path.write_bytes(b"".join(self.chunks))


def row_summaries(rows: np.ndarray) -> dict:
    idx, vals = topk_rows(rows)
    return {
        "argmax": [int(i) for i in idx[:, 0]],
        "top5_ids": [[int(i) for i in r] for r in idx],
        "top5_values": [[f32(v) for v in r] for r in vals],
    }


def tiny_goldens(vers: dict) -> list[str]:
    written = []
    for path in sorted(MODELS.glob("*.gguf")):
        name = path.stem
        model, patched, window = load(path)
        bw = BinWriter()
        cases = []
        wchecks = []
        for prompt in TINY_PROMPTS:
            gen, rows = greedy(model, prompt, TINY_N_GEN)
            L = len(prompt)
            summ = row_summaries(rows)
            cases.append({
                "prompt_ids": prompt,
                "generated_ids": gen,
                "prompt_logits": bw.add(rows[:L]),
                "n_rows": int(rows.shape[0]),
                **summ,
                **margins(summ, L),
            })
            if window is not None:
                wchecks.append(window_check(model, prompt + gen[:-1], rows, window))
        extra = {}
        if window is not None:
            extra = {
                "sliding_window": window,
                "sliding_window_note": "GGUF llama.attention.sliding_window; transformers' GGUF loader drops it (the "
                                       "file loads as LlamaForCausalLM), so the loaded weights are evaluated by "
                                       f"MistralForCausalLM(sliding_window={window}, attn_implementation='eager')",
                "sliding_window_mask_check": check_window_mask(model, 12, window),
                "window_check": {
                    "note": "per case, teacher-forced over seq[0..n_rows-1] in one full forward: max |logit diff| "
                            "vs the same model with sliding_window=None (rows < window must be 0, every row >= "
                            "window must differ), and vs the golden rows (which come from per-step forwards)",
                    "cases": wchecks,
                },
            }
        golden = {
            "format": "ferry-golden-tiny-v1",
            "model_file": f"tests/data/models/{path.name}",
            "model_sha256": sha256(path),
            "reference": "transformers AutoModelForCausalLM.from_pretrained(gguf_file=..., dtype=float32, "
                         "attn_implementation='eager'), greedy by full-recompute forwards",
            "rope_freqs_applied": patched,
            "loaded_as": type(model).__name__,
            "versions": vers,
            "n_vocab": int(model.config.vocab_size),
            "n_gen": TINY_N_GEN,
            "bin_file": f"{name}.bin",
            "bin_dtype": "float32 little-endian, row-major",
            "rows_note": "row r of a case is the logits after feeding tokens seq[0..r] where seq = prompt_ids + "
                         "generated_ids; rows 0..L-1 = prompt positions, row L-1+k predicts generated_ids[k]. "
                         "prompt_logits = full logits of rows 0..L-1; argmax/top5_* cover all L+n_gen-1 rows.",
            **extra,
            "cases": cases,
        }
        (GOLDENS / f"{name}.json").write_text(json.dumps(golden, indent=1) + "\n")
        bw.write(GOLDENS / f"{name}.bin")
        written += [f"{name}.json", f"{name}.bin"]
        print(f"{name}: generated {[c['generated_ids'][:6] for c in cases]} "
              f"min gen margin {min(c['min_gen_margin'] for c in cases):.4f}")
    return written


def window_check(model, seq: list[int], rows: np.ndarray, window: int) -> dict:
    import torch

    with torch.no_grad():
        full = model(torch.tensor([seq])).logits[0].float().numpy()
        free = without_window(model)(torch.tensor([seq])).logits[0].float().numpy()
    wd = window_diffs([full], [free], window)
    assert wd["max_abs_diff_positions_lt_window"] == 0.0, wd
    assert wd["min_row_max_abs_diff_positions_ge_window"] > 1e-3, wd
    d_steps = float(np.abs(full - rows).max())
    assert d_steps < 1e-4, d_steps
    return {**{k: f32(v) for k, v in wd.items()}, "max_abs_diff_single_forward_vs_golden_rows": f32(d_steps)}


def smollm_tokenizer(path: Path):
    from tokenizers import Regex, pre_tokenizers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    # transformers 5.23 does not know tokenizer.ggml.pre == "smollm" and would fall back to the
    # plain GPT-2 split.  Use SmolLM2's real pre-tokenizer (== llama.cpp's smollm regexes):
    # split every digit on its own, then GPT-2 byte-level regex.
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    return tok


def smollm_goldens(path: Path, vers: dict) -> list[str]:
    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    tok = smollm_tokenizer(path)
    model, _, _ = load(path)
    V = int(model.config.vocab_size)
    subset = np.arange(0, V, SUBSET_STRIDE)
    assert len(subset) == 1024, len(subset)

    prompts = [{"kind": "plain", "text": t, "ids": tok(t, add_special_tokens=False)["input_ids"]}
               for t in SMOLLM_PLAIN_PROMPTS]
    chat_text = tok.apply_chat_template(SMOLLM_CHAT, tokenize=False, add_generation_prompt=True)
    chat_ids = tok(chat_text, add_special_tokens=False)["input_ids"]
    prompts.append({"kind": "chat", "messages": SMOLLM_CHAT, "text": chat_text, "ids": chat_ids})

    bw = BinWriter()
    cases = []
    for p in prompts:
        gen, rows = greedy(model, p["ids"], SMOLLM_N_GEN)
        L = len(p["ids"])
        summ = row_summaries(rows)
        case = {k: v for k, v in p.items() if k != "ids"}
        case.update({
            "prompt_ids": p["ids"],
            "generated_ids": gen,
            "generated_text": tok.decode(gen),
            "n_rows": int(rows.shape[0]),
            **summ,
            "subset_logits": bw.add(rows[:, subset]),
            "last_prompt_logits": bw.add(rows[L - 1]),
            **margins(summ, L),
        })
        cases.append(case)
        print(f"smollm2 [{p['kind']}] {p['text'][:40]!r} L={L} -> {tok.decode(gen)!r}")

    tok_cases = [{"text": t, "ids": tok(t, add_special_tokens=False)["input_ids"]} for t in SMOLLM_TOKENIZER_TEXTS]
    for c in tok_cases:
        assert tok.decode(c["ids"]) == c["text"], c
    golden = {
        "format": "ferry-golden-smollm2-v1",
        "model_file": "$HOME/.cache/ferry/models/" + path.name,
        "model_sha256": sha256(path),
        "reference": "transformers AutoModelForCausalLM.from_pretrained(gguf_file=..., dtype=float32, "
                     "attn_implementation='eager'), greedy by full-recompute forwards; tokenizer = "
                     "AutoTokenizer.from_pretrained(gguf_file=...) with its pre-tokenizer replaced by "
                     "SmolLM2's (digits split individually + GPT-2 byte-level regex)",
        "versions": vers,
        "n_vocab": V,
        "n_gen": SMOLLM_N_GEN,
        "add_bos": False,
        "subset_ids": {"start": 0, "stride": SUBSET_STRIDE, "count": int(len(subset))},
        "bin_file": "smollm2.bin",
        "bin_dtype": "float32 little-endian, row-major",
        "rows_note": "row r of a case is the logits after feeding seq[0..r], seq = prompt_ids + generated_ids; "
                     "rows 0..L-1 = prompt positions, row L-1+k predicts generated_ids[k] (L+n_gen-1 rows). "
                     "subset_logits[r][j] = logits[r][start + j*stride]; last_prompt_logits = full row L-1.",
        "cases": cases,
        "tokenizer_cases": tok_cases,
    }
    (GOLDENS / "smollm2.json").write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")
    bw.write(GOLDENS / "smollm2.bin")
    return ["smollm2.json", "smollm2.bin"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--tiny-only", action="store_true")
    g.add_argument("--smollm-only", action="store_true")
    ap.add_argument("--smollm", default=str(SMOLLM_DEFAULT))
    args = ap.parse_args()
    GOLDENS.mkdir(parents=True, exist_ok=True)
    vers = versions()
    if not args.smollm_only:
        tiny_goldens(vers)
    if not args.tiny_only:
        smollm_goldens(Path(args.smollm), vers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
