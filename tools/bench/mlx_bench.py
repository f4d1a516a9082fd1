#!/usr/bin/env python3
"""mlx-lm measured the way llama-bench measures llama.cpp (run with the
mlx-lm venv's python; tools/peers/install-mlx-lm.sh makes it).

  mlx_bench.py bench MODEL_DIR [--prompt-tokens 512] [--gen-tokens 128] [--reps 1]
      Prefill: one prompt of exactly --prompt-tokens token ids (fixed ids,
      no tokenizer involved) through mlx_lm.stream_generate, generating one
      token; prefill tokens/s is mlx-lm's own prompt_tps.
      Decode: a 1-token prompt, then --gen-tokens tokens with every EOS id
      removed (mlx-lm has no ignore_eos; an empty EOS set is the same
      thing); decode tokens/s is mlx-lm's generation_tps.
      Prints one JSON object: {"prefill_tps": [...], "decode_tps": [...]}.

  mlx_bench.py server ARGS...
      mlx_lm.server with EOS ids removed, so `ignore_eos` workloads
      (tools/bench/serve_bench.py) produce max_tokens tokens there too.
      ARGS go to mlx_lm.server unchanged.
"""
from __future__ import annotations

import json
import sys


def no_eos() -> None:
    """Makes every mlx-lm tokenizer report no EOS ids."""
    from mlx_lm import tokenizer_utils

    tokenizer_utils.TokenizerWrapper.eos_token_ids = property(
        lambda self: set(), lambda self, value: None)


def bench(argv: list[str]) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="mlx_bench.py bench")
    ap.add_argument("model")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=1)
    a = ap.parse_args(argv)

    no_eos()
    import mlx.core as mx
    from mlx_lm import load, stream_generate
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = load(a.model)
    greedy = make_sampler(temp=0.0)
    # Token ids 1000.. cycled: ordinary vocabulary entries, same for every run.
    prompt = [1000 + (i * 7) % 5000 for i in range(a.prompt_tokens)]

    def last(prompt_ids: list[int], n: int):
        r = None
        for r in stream_generate(model, tokenizer, prompt_ids, max_tokens=n, sampler=greedy):
            pass
        return r

    last(prompt[:16], 4)  # warm-up: graph set-up and first-use allocations
    out = {"engine": "mlx-lm", "device": str(mx.default_device()),
           "prompt_tokens": a.prompt_tokens, "gen_tokens": a.gen_tokens,
           "prefill_tps": [], "decode_tps": []}
    for _ in range(a.reps):
        if a.prompt_tokens > 0:
            out["prefill_tps"].append(round(last(prompt, 1).prompt_tps, 3))
        if a.gen_tokens > 0:
            r = last(prompt[:1], a.gen_tokens)
            if r.generation_tokens != a.gen_tokens:
                sys.exit(f"mlx_bench: generated {r.generation_tokens} of {a.gen_tokens} tokens")
            out["decode_tps"].append(round(r.generation_tps, 3))
    print(json.dumps(out))


def server(argv: list[str]) -> None:
    no_eos()
    from mlx_lm import server as mlx_server

    sys.argv = ["mlx_lm.server"] + argv
    mlx_server.main()


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("bench", "server"):
        sys.exit(__doc__)
    {"bench": bench, "server": server}[sys.argv[1]](sys.argv[2:])
