#!/usr/bin/env python3
"""Load generator for `ferry serve`: streaming completions at several
concurrency levels over loopback, standard library only.

    python3 tools/load_test.py [--ferry build/ferry] [--model M.gguf]
                               [--levels 1,16,64,256] [--seconds 20] [--max-tokens 64]

Starts the server (unless --port names a running one), then for each level
keeps that many streams open for --seconds: each client sends a request
(ignore_eos, so every answer has exactly --max-tokens tokens), reads the SSE
stream, and sends the next one. Reports requests/s, output tokens/s, time
to first token and inter-token latency (p50/p99, client side: the gap
between content chunks), and the server's resident memory.
"""
import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


async def one_request(port, body, stats):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    await writer.drain()
    t0 = time.perf_counter()
    last = None
    tokens = 0
    buf = b""
    status = await reader.readline()
    if b" 200 " not in status:
        stats["errors"] += 1
        writer.close()
        return
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            break
        now = time.perf_counter()
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            i = event.find(b"data: ")
            if i < 0:
                continue
            payload = event[i + 6:]
            if payload == b"[DONE]":
                continue
            j = json.loads(payload)
            if j.get("usage"):
                tokens = j["usage"]["completion_tokens"]
            if any(c.get("text") for c in j.get("choices", [])):
                if last is None:
                    stats["ttft"].append(now - t0)
                else:
                    stats["itl"].append(now - last)
                last = now
    writer.close()
    stats["requests"] += 1
    stats["tokens"] += tokens


async def level(port, clients, seconds, max_tokens):
    stats = {"ttft": [], "itl": [], "requests": 0, "tokens": 0, "errors": 0}
    deadline = time.perf_counter() + seconds

    async def client(i):
        n = 0
        while time.perf_counter() < deadline:
            body = {"prompt": f"Request {i}.{n}: tell me a story about the sea.",
                    "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.8,
                    "seed": i * 1000 + n, "stream": True,
                    "stream_options": {"include_usage": True}}
            await one_request(port, body, stats)
            n += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    stats["elapsed"] = time.perf_counter() - t0
    return stats


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def metric(port, name):
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--ferry", default=os.path.join(root, "build", "ferry"))
    ap.add_argument("--model", default=os.environ.get("FERRY_MODEL", os.path.expanduser(
        "~/.cache/ferry/models/SmolLM2-135M-Instruct.Q4_1.gguf")))
    ap.add_argument("--levels", default="1,16,64,256")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--serve-args", default="", help="extra flags for ferry serve")
    args = ap.parse_args()

    proc = subprocess.Popen([args.ferry, "serve", "-q", "-m", args.model, "--port", "0"] +
                            args.serve_args.split(), stderr=subprocess.PIPE, text=True)
    port = None
    for line in proc.stderr:
        m = re.search(r"on http://[^:]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if not port:
        sys.exit("server did not start")
    idle_rss = rss_mib(proc.pid)
    print(f"model {os.path.basename(args.model)}, {args.max_tokens} tokens per request, "
          f"{args.seconds:.0f} s per level, {os.cpu_count()} cores; server RSS idle {idle_rss:.0f} MiB")
    print("| streams | req/s | output tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | RSS MiB | KV MiB allocated |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    try:
        for c in [int(x) for x in args.levels.split(",")]:
            peak = {"rss": 0.0, "kv": 0.0}

            async def run():
                task = asyncio.ensure_future(level(port, c, args.seconds, args.max_tokens))
                while not task.done():
                    peak["rss"] = max(peak["rss"], rss_mib(proc.pid))
                    peak["kv"] = max(peak["kv"], await asyncio.to_thread(
                        metric, port, "ferry_kv_bytes_allocated") / 2**20)
                    await asyncio.sleep(0.5)
                return task.result()

            s = asyncio.run(run())
            ms = lambda v: f"{v * 1000:.0f} ms"
            print(f"| {c} | {s['requests'] / s['elapsed']:.2f} | {s['tokens'] / s['elapsed']:.0f} | "
                  f"{ms(pct(s['ttft'], 50))} | {ms(pct(s['ttft'], 99))} | {ms(pct(s['itl'], 50))} | "
                  f"{ms(pct(s['itl'], 99))} | {peak['rss']:.0f} | {peak['kv']:.1f} |"
                  + (f" ({s['errors']} errors)" if s["errors"] else ""), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)


if __name__ == "__main__":
    main()
