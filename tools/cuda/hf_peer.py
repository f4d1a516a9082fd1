#!/usr/bin/env python3
"""Hugging Face transformers as the GPU peer (issue 6), on a model of the
same shape as ferry's random GGUF, with random bf16 weights made on the GPU.
Random weights measure speed only.

  hf_peer.py [--shape llama-3.1-8b] [--prompt 128] [--output 128]
             [--batches 64,256] [--json OUT]

Measures, with greedy decoding and every request generating exactly
--output tokens (min_new_tokens = max_new_tokens, so EOS cannot end one
early):
- single stream: `generate` on one prompt; tok/s = output / (wall - TTFT),
  where TTFT is the wall time of a 1-token generate of the same prompt;
- single stream with a static KV cache (`cache_implementation="static"`,
  which makes generate compile the forward);
- continuous batching: `generate_batch` over N prompts; output tok/s =
  N * output / wall.
Runs on the GPU machine's own torch/transformers (whatever versions it has;
they are printed).
"""
import argparse
import json
import sys
import time

import torch
import transformers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

SHAPES = {
    "llama-3.1-8b": dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                         num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
                         rope_theta=500000.0, max_position_embeddings=8192),
    "llama-3.2-1b": dict(num_hidden_layers=16, hidden_size=2048, num_attention_heads=32,
                         num_key_value_heads=8, intermediate_size=8192, vocab_size=128256,
                         rope_theta=500000.0, max_position_embeddings=8192),
}


def sync_time() -> float:
    torch.cuda.synchronize()
    return time.perf_counter()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--json")
    ap.add_argument("--skip-static", action="store_true")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name()}", flush=True)

    cfg = LlamaConfig(**SHAPES[args.shape], bos_token_id=256, eos_token_id=257,
                      pad_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.eval()
    g = torch.Generator(device="cpu").manual_seed(1)
    prompt = torch.randint(258, cfg.vocab_size, (1, args.prompt), generator=g).cuda()
    out = {"torch": torch.__version__, "transformers": transformers.__version__,
           "shape": args.shape}

    def gen_cfg(n: int, **kw) -> GenerationConfig:
        return GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                eos_token_id=257, pad_token_id=0, **kw)

    def single(name: str, **kw) -> None:
        with torch.inference_mode():
            model.generate(prompt, generation_config=gen_cfg(8, **kw))  # warm-up / compile
            t0 = sync_time()
            model.generate(prompt, generation_config=gen_cfg(1, **kw))
            ttft = sync_time() - t0
            t0 = sync_time()
            r = model.generate(prompt, generation_config=gen_cfg(args.output, **kw))
            wall = sync_time() - t0
        n = r.shape[1] - args.prompt
        tps = (n - 1) / max(wall - ttft, 1e-9)
        out[name] = {"tokens": n, "wall_s": wall, "ttft_s": ttft, "decode_tok_s": tps}
        print(f"{name}: {n} tokens, wall {wall:.2f} s, TTFT {ttft * 1e3:.1f} ms, "
              f"decode {tps:.1f} tok/s", flush=True)

    single("generate")
    if not args.skip_static:
        try:
            single("generate_static", cache_implementation="static")
        except Exception as e:  # report, keep measuring the rest
            print(f"generate_static failed: {e}", file=sys.stderr)

    for n in [int(x) for x in args.batches.split(",") if x]:
        inputs = torch.randint(258, cfg.vocab_size, (n, args.prompt), generator=g).tolist()
        try:
            # Not inside torch.inference_mode(): generate_batch manages its
            # own, and under an outer one its static tensors cannot be reset
            # (transformers 5.17: "Inplace update to inference tensor").
            model.generate_batch(inputs=inputs[: min(n, 8)], generation_config=gen_cfg(8),
                                 progress_bar=False)
            t0 = sync_time()
            res = model.generate_batch(inputs=inputs, generation_config=gen_cfg(args.output),
                                       progress_bar=False)
            wall = sync_time() - t0
            toks = sum(len(r.generated_tokens) for r in res.values())
            out[f"batch_{n}"] = {"requests": n, "tokens": toks, "wall_s": wall,
                                 "output_tok_s": toks / wall}
            print(f"generate_batch {n}: {toks} tokens in {wall:.2f} s = {toks / wall:.1f} tok/s",
                  flush=True)
        except Exception as e:
            print(f"generate_batch {n} failed: {e}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
