#!/usr/bin/env python3
"""Makes tests/data/tokenizer/goldens.json: what HF `tokenizers` encodes the
corpus (tests/data/tokenizer/corpus.json) to, for each byte-level BPE family,
with the vocabulary and merges of the default model's GGUF.

The reference tokenizer is assembled here from HF's own components, not loaded
from a tokenizer.json, so each family's pre-tokenizer is the published one:
  gpt2       ByteLevel(add_prefix_space=False, use_regex=True) (GPT-2's)
  smollm     Sequence[Digits(individual_digits=True),
                      ByteLevel(add_prefix_space=False, use_regex=True)]
             (SmolLM2's tokenizer.json)
  llama-bpe  Split(Regex(LLAMA3), "isolated"), ByteLevel(use_regex=False);
             BPE with ignore_merges=True, as Llama 3's tokenizer.json has it
  qwen2      Split(Regex(QWEN2), "isolated"), ByteLevel(use_regex=False)
Control tokens (GGUF token_type 3) are special AddedTokens, user-defined ones
(type 4) plain AddedTokens, both matched on the raw text.

The corpus is a list of {"name", "text"} (and "roundtrip": false where the
text has bytes the vocabulary has no token for). Per case and family this records:
  ids        encode(text) with special tokens parsed
  ids_plain  encode with encode_special_tokens=True (C++ parse_special=false),
             only where it differs from ids
  pieces     the pre-tokenizer's pieces of the whole text as UTF-8 byte
             ranges [begin, end) (added tokens not cut out)

Usage (pinned versions: tools/goldens/requirements.txt):
  python3 tools/goldens/tokenizer_goldens.py [--model PATH]
"""

import argparse
import json
import os
from importlib.metadata import version
from pathlib import Path

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = Path(os.environ.get("HOME", "~")) / ".cache/ferry/models/SmolLM2-135M-Instruct.Q4_1.gguf"

# Published pre-tokenizer regexes (Llama 3's and Qwen2's tokenizer.json).
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CONTROL, USER_DEFINED = 3, 4


def read_gguf(path):
    r = gguf.GGUFReader(str(path))

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    f = r.fields["tokenizer.ggml.token_type"]
    types = [int(f.parts[i][0]) for i in f.data]
    return strings("tokenizer.ggml.tokens"), types, strings("tokenizer.ggml.merges")


def build(family, tokens, types, merges):
    vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}  # first duplicate wins
    merge_pairs = [tuple(m.split(" ")) for m in merges]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if family == "gpt2":
        model = models.BPE(vocab, merge_pairs)
        pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif family == "smollm":
        model = models.BPE(vocab, merge_pairs)
        pre = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    elif family in ("llama-bpe", "qwen2"):
        model = models.BPE(vocab, merge_pairs, ignore_merges=(family == "llama-bpe"))
        regex = LLAMA3 if family == "llama-bpe" else QWEN2
        pre = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated"), byte_level])
    else:
        raise ValueError(family)
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([
        AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == CONTROL])
    tok.add_tokens([
        AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types)
        if ty == USER_DEFINED])
    return tok


def byte_pieces(pre, text):
    out = []
    for _, (b, e) in pre.pre_tokenize_str(text):  # offsets in code points
        out.append([len(text[:b].encode("utf-8")), len(text[:e].encode("utf-8"))])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--corpus", type=Path, default=ROOT / "tests/data/tokenizer/corpus.json")
    ap.add_argument("--out", type=Path, default=ROOT / "tests/data/tokenizer/goldens.json")
    args = ap.parse_args()

    tokens, types, merges = read_gguf(args.model)
    corpus = json.loads(args.corpus.read_text(encoding="utf-8"))
    families = {}
    for family in ("smollm", "gpt2", "llama-bpe", "qwen2"):
        tok = build(family, tokens, types, merges)
        cases = []
        for case in corpus:
            text = case["text"]
            tok.encode_special_tokens = False
            ids = tok.encode(text, add_special_tokens=False).ids
            tok.encode_special_tokens = True
            ids_plain = tok.encode(text, add_special_tokens=False).ids
            # A case marked "roundtrip": false has bytes without a token, which
            # BPE drops (no unknown token), as the reference does.
            round_trips = tok.decode(ids, skip_special_tokens=False) == text
            assert round_trips == case.get("roundtrip", True), (family, case["name"])
            entry = {"name": case["name"], "ids": ids}
            if ids_plain != ids:
                entry["ids_plain"] = ids_plain
            entry["pieces"] = byte_pieces(tok.pre_tokenizer, text)
            cases.append(entry)
        families[family] = cases

    out = {
        "generator": "tools/goldens/tokenizer_goldens.py",
        "tokenizers": version("tokenizers"),
        "gguf": version("gguf"),
        "model": args.model.name,
        "vocab_size": len(tokens),
        "corpus": str(args.corpus.relative_to(ROOT)) if args.corpus.is_relative_to(ROOT) else str(args.corpus),
        "families": families,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        # One case per line keeps diffs readable.
        f.write("{\n")
        head = {k: v for k, v in out.items() if k != "families"}
        for k, v in head.items():
            f.write(f"  {json.dumps(k)}: {json.dumps(v)},\n")
        f.write('  "families": {\n')
        for fi, (family, cases) in enumerate(families.items()):
            f.write(f"    {json.dumps(family)}: [\n")
            for ci, c in enumerate(cases):
                comma = "," if ci + 1 < len(cases) else ""
                f.write(f"      {json.dumps(c, separators=(',', ':'))}{comma}\n")
            f.write("    ]" + ("," if fi + 1 < len(families) else "") + "\n")
        f.write("  }\n}\n")
    print(f"wrote {args.out}: {len(corpus)} cases x {len(families)} families")


if __name__ == "__main__":
    main()
