#!/usr/bin/env python3
"""Serving benchmark: drives any OpenAI-compatible server with one workload.

    serve_bench.py --url http://127.0.0.1:8080 --requests 64 --concurrency 16 \\
        --prompt-tokens 128 --max-tokens 128 --tokenizer DIR/tokenizer.json

The same client measures `ferry serve`, `llama-server` and `mlx_lm.server`.
Each request is a streaming POST /v1/completions (raw text, no chat template)
with temperature 0, `ignore_eos: true` (ferry and llama-server honour it;
mlx_lm.server needs tools/bench/mlx_noeos.py) and `max_tokens`, so every
engine produces the same number of tokens. At most --concurrency requests
are in flight; a new one starts as soon as one finishes (closed loop).

Prompt length: with --tokenizer (a tokenizer.json, read with the `tokenizers`
package) each prompt is cut to exactly --prompt-tokens tokens; else the
server's /tokenize endpoint (llama-server) is tried; else words of the filler
text stand in for tokens (approximate). Prompts start with a distinct
request number so no server can reuse another request's prefix.

Figures (times from the client's monotonic clock):
  requests/s         finished requests / wall time of the timed run
  output tokens/s    generated tokens (usage.completion_tokens when the server
                     reports it, else streamed chunks) / wall time
  TTFT               request sent -> first streamed text chunk
  ITL                gaps between consecutive text chunks of one request
                     (a chunk may carry several tokens; chunks/tokens says)
  E2E                request sent -> stream closed
Prints a table, and the JSON record with --json-out (or --json to stdout).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass, field

import aiohttp

FILLER = (
    "The river ran past the old mill where the miller kept his books in a "
    "wooden chest, and every morning the children of the village walked "
    "along its bank to the school on the hill, counting the boats, naming "
    "the birds and arguing about the weather of the coming week. "
)


@dataclass
class RequestResult:
    ok: bool = False
    error: str = ""
    ttft: float | None = None
    e2e: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    tokens: int = 0  # usage.completion_tokens, or chunks when absent
    usage_reported: bool = False


def percentile(xs: list[float], p: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


# ------------------------------------------------------------------ prompts

class PromptMaker:
    """Prompts of one token length, exact when a tokenizer is available."""

    def __init__(self, args: argparse.Namespace):
        self.n = args.prompt_tokens
        self.count = None  # text -> token count
        self.how = "approximate (filler words)"
        if args.tokenizer:
            from tokenizers import Tokenizer
            tok = Tokenizer.from_file(args.tokenizer)
            self.count = lambda text: len(tok.encode(text, add_special_tokens=False).ids)
            self.how = "exact (" + args.tokenizer + ")"

    async def use_server_tokenizer(self, session: aiohttp.ClientSession, url: str) -> None:
        if self.count is not None:
            return
        try:
            async with session.post(url + "/tokenize", json={"content": "hello world"}) as r:
                if r.status != 200 or "tokens" not in await r.json():
                    return
        except (aiohttp.ClientError, json.JSONDecodeError, asyncio.TimeoutError):
            return
        self.remote = (session, url)
        self.how = "exact (server /tokenize)"

    async def _count(self, text: str) -> int:
        if self.count is not None:
            return self.count(text)
        session, url = self.remote
        async with session.post(url + "/tokenize", json={"content": text}) as r:
            return len((await r.json())["tokens"])

    async def make(self, i: int) -> str:
        head = f"Request {i}: "
        words = (FILLER * (self.n // 8 + 4)).split(" ")
        if self.count is None and not hasattr(self, "remote"):
            return head + " ".join(words[: max(1, self.n - 3)])
        # Longest word prefix whose token count is <= n (token counts grow
        # with words, one or more per word), found by bisection.
        lo, hi = 1, len(words)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if await self._count(head + " ".join(words[:mid])) <= self.n:
                lo = mid
            else:
                hi = mid - 1
        text = head + " ".join(words[:lo])
        # Pad with dots up to n tokens (a dot adds at most one token; dots
        # may merge, hence the bound).
        for _ in range(64):
            if await self._count(text) >= self.n:
                break
            text += " ."
        return text


# ----------------------------------------------------------------- requests

async def one_request(session: aiohttp.ClientSession, args: argparse.Namespace,
                      prompt: str) -> RequestResult:
    body = {
        "prompt": prompt,
        "max_tokens": args.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    if args.model:
        body["model"] = args.model
    res = RequestResult()
    t0 = time.perf_counter()
    try:
        async with session.post(args.url + "/v1/completions", json=body) as r:
            if r.status != 200:
                res.error = f"HTTP {r.status}: {(await r.text())[:200]}"
                return res
            buf = b""
            done = False
            async for data in r.content.iter_any():
                buf += data
                while b"\n" in buf and not done:
                    line, buf = buf.split(b"\n", 1)
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        break
                    ev = json.loads(payload)
                    now = time.perf_counter()
                    if "error" in ev:
                        res.error = str(ev["error"])[:200]
                        return res
                    for ch in ev.get("choices") or []:
                        if ch.get("text"):
                            if res.ttft is None:
                                res.ttft = now - t0
                            res.chunk_times.append(now)
                    usage = ev.get("usage")
                    if usage and usage.get("completion_tokens") is not None:
                        res.tokens = int(usage["completion_tokens"])
                        res.usage_reported = True
                if done:
                    break
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
        return res
    res.e2e = time.perf_counter() - t0
    if not res.usage_reported:
        res.tokens = len(res.chunk_times)
    res.ok = res.ttft is not None
    if not res.ok and not res.error:
        res.error = "stream closed without text"
    return res


async def run(args: argparse.Namespace) -> dict:
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    # A fresh connection per request: servers close idle keep-alive
    # connections on their own schedules (cpp-httplib does), and a reused
    # dead one fails as "Can not write request body". Loopback connects
    # cost microseconds.
    conn = aiohttp.TCPConnector(limit=args.concurrency + 2, force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
        maker = PromptMaker(args)
        await maker.use_server_tokenizer(session, args.url)
        prompts = [await maker.make(i) for i in range(args.requests + args.warmup)]

        # Warm-up requests (sequential, not timed): page in weights, JIT etc.
        for i in range(args.warmup):
            w = await one_request(session, args, prompts[args.requests + i])
            if not w.ok:
                sys.exit(f"serve_bench: warm-up request failed: {w.error}")

        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(args.requests):
            queue.put_nowait(i)
        results: list[RequestResult] = [RequestResult() for _ in range(args.requests)]

        async def worker() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                results[i] = await one_request(session, args, prompts[i])

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        wall = time.perf_counter() - t0

    ok = [r for r in results if r.ok]
    errors = [r.error for r in results if not r.ok]
    itl = [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    ttft = [r.ttft for r in ok]
    e2e = [r.e2e for r in ok]
    tokens = sum(r.tokens for r in ok)
    chunks = sum(len(r.chunk_times) for r in ok)
    ms = lambda v: None if v is None else round(v * 1000.0, 2)  # noqa: E731
    return {
        "label": args.label,
        "url": args.url,
        "workload": {"requests": args.requests, "concurrency": args.concurrency,
                     "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
                     "prompt_length": maker.how, "warmup": args.warmup},
        "completed": len(ok),
        "failed": len(errors),
        "errors": errors[:5],
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(ok) / wall, 3),
        "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / wall, 2),
        "tokens_per_chunk": round(tokens / chunks, 3) if chunks else None,
        "usage_reported": all(r.usage_reported for r in ok) if ok else False,
        "ttft_ms": {"mean": ms(statistics.fmean(ttft)) if ttft else None,
                    "p50": ms(percentile(ttft, 50)), "p99": ms(percentile(ttft, 99))},
        "itl_ms": {"mean": ms(statistics.fmean(itl)) if itl else None,
                   "p50": ms(percentile(itl, 50)), "p99": ms(percentile(itl, 99))},
        "e2e_ms": {"p50": ms(percentile(e2e, 50)), "p99": ms(percentile(e2e, 99))},
    }


def table(rec: dict) -> str:
    w = rec["workload"]
    rows = [
        ("server", f"{rec['label'] or rec['url']}"),
        ("workload", f"{w['requests']} requests, concurrency {w['concurrency']}, "
                     f"{w['prompt_tokens']} prompt + {w['max_tokens']} output tokens"),
        ("prompt length", w["prompt_length"]),
        ("completed / failed", f"{rec['completed']} / {rec['failed']}"),
        ("wall", f"{rec['wall_s']} s"),
        ("requests/s", f"{rec['requests_per_s']}"),
        ("output tokens/s", f"{rec['output_tokens_per_s']}"),
        ("tokens per chunk", f"{rec['tokens_per_chunk']}"),
        ("TTFT p50 / p99", f"{rec['ttft_ms']['p50']} / {rec['ttft_ms']['p99']} ms"),
        ("ITL p50 / p99", f"{rec['itl_ms']['p50']} / {rec['itl_ms']['p99']} ms"),
        ("E2E p50 / p99", f"{rec['e2e_ms']['p50']} / {rec['e2e_ms']['p99']} ms"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8080")
    ap.add_argument("--model", default="", help="the request's model field (optional)")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--tokenizer", default="", help="tokenizer.json for exact prompt lengths")
    ap.add_argument("--warmup", type=int, default=1, help="untimed requests first")
    ap.add_argument("--timeout", type=float, default=1800.0, help="per request, seconds")
    ap.add_argument("--label", default="")
    ap.add_argument("--json", action="store_true", help="print the JSON record, not the table")
    ap.add_argument("--json-out", default="", help="also write the JSON record here")
    ap.add_argument("--print-prompt", action="store_true",
                    help="print request 0's prompt (needs --tokenizer) and exit")
    args = ap.parse_args()
    if args.print_prompt:
        if not args.tokenizer:
            ap.error("--print-prompt needs --tokenizer")
        print(asyncio.run(PromptMaker(args).make(0)))
        return 0
    if not args.url.startswith(("http://127.", "http://localhost", "http://[::1]")):
        ap.error("--url must be a loopback address (this tool only benchmarks local servers)")
    args.url = args.url.rstrip("/")
    rec = asyncio.run(run(args))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rec, f, indent=2)
    print(json.dumps(rec) if args.json else table(rec))
    return 0 if rec["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
