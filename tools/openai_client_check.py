#!/usr/bin/env python3
"""Drives `ferry serve` with the official `openai` Python client.

    pip install openai==3.51.0
    python3 tools/openai_client_check.py [--ferry build/ferry] [--model MODEL.gguf]

Starts the server on a free loopback port (with an API key), checks
streaming chat, completions, n > 1, stop, logprobs, usage in streams and
the client's error classes, then stops the server with SIGTERM and checks
that it exits 0. Exits non-zero on the first failed check.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time

import openai
from openai import OpenAI

PINNED = "3.51.0"
KEY = "sk-ferry-check"


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        raise SystemExit(1)


def start_server(ferry, model):
    proc = subprocess.Popen(
        [ferry, "serve", "-m", model, "--port", "0", "--api-key", KEY],
        stderr=subprocess.PIPE, text=True)
    port = None
    log = []
    for line in proc.stderr:
        log.append(line)
        m = re.search(r"on http://[^:]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        sys.exit("server did not start:\n" + "".join(log))
    # Keep draining stderr so the server never blocks on it.
    threading.Thread(target=lambda: [log.append(l) for l in proc.stderr], daemon=True).start()
    return proc, port, log


def main():
    ap = argparse.ArgumentParser()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--ferry", default=os.path.join(root, "build", "ferry"))
    ap.add_argument("--model", default=os.environ.get("FERRY_MODEL", os.path.expanduser(
        "~/.cache/ferry/models/SmolLM2-135M-Instruct.Q4_1.gguf")))
    args = ap.parse_args()
    print(f"openai {openai.__version__} (pinned {PINNED}); model {args.model}")
    if openai.__version__ != PINNED:
        print(f"warning: this check was written against openai=={PINNED}")

    proc, port, log = start_server(args.ferry, args.model)
    try:
        run_checks(port)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = None
    check(code == 0, f"SIGTERM: server exited with {code}")
    print("all checks passed")


def run_checks(port):
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)
    model = client.models.list().data[0].id
    check(bool(model), f"models.list: {model}")

    # Streaming chat equals the same request answered whole.
    msgs = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    t0 = time.time()
    stream = client.chat.completions.create(model=model, messages=msgs, stream=True,
                                            temperature=0, max_tokens=48,
                                            stream_options={"include_usage": True})
    pieces, roles, finish, usage = [], [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.role:
                roles.append(c.delta.role)
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    streamed = "".join(pieces)
    print(f"      streamed chat ({time.time() - t0:.2f} s, {len(pieces)} pieces): {streamed!r}")
    check(roles == ["assistant"] and len(pieces) > 3, "chat stream: role chunk, then content pieces")
    check(finish in ("stop", "length"), f"chat stream: finish_reason {finish}")
    check(usage is not None and usage.completion_tokens > 0 and
          usage.total_tokens == usage.prompt_tokens + usage.completion_tokens,
          f"chat stream: usage chunk {usage}")
    whole = client.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=48)
    check(whole.choices[0].message.content == streamed and whole.choices[0].message.role == "assistant",
          "chat: whole answer equals the streamed one")
    check(whole.object == "chat.completion" and whole.id.startswith("chatcmpl-"), "chat: id and object")

    # Completions, whole and streamed.
    prompt = "The three primary colors are"
    comp = client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0)
    text = comp.choices[0].text
    print(f"      completion: {text!r}")
    check(comp.object == "text_completion" and len(text) > 0, "completions: text")
    check(comp.usage.completion_tokens > 0, f"completions: usage {comp.usage}")
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt=prompt, max_tokens=24, temperature=0, stream=True) if c.choices)
    check(streamed == text, "completions: streamed text equals the whole one")

    # n > 1, seeded: distinct choices, and reproducible.
    many = client.completions.create(model=model, prompt="Once upon a time", max_tokens=16,
                                     temperature=1.0, n=3, seed=7)
    texts = [c.text for c in sorted(many.choices, key=lambda c: c.index)]
    for t in texts:
        print(f"      n=3 choice: {t!r}")
    check([c.index for c in many.choices] == [0, 1, 2], "n=3: three choices, indexes 0..2")
    check(len(set(texts)) > 1, "n=3: choices differ")
    again = client.completions.create(model=model, prompt="Once upon a time", max_tokens=16,
                                      temperature=1.0, n=3, seed=7)
    check([c.text for c in sorted(again.choices, key=lambda c: c.index)] == texts,
          "n=3: same seed, same choices")
    chat_n = client.chat.completions.create(model=model, messages=msgs, n=2, seed=1,
                                            temperature=0.9, max_tokens=24, stream=True)
    by_index = {}
    for chunk in chat_n:
        for c in chunk.choices:
            by_index.setdefault(c.index, "")
            by_index[c.index] += c.delta.content or ""
    check(sorted(by_index) == [0, 1], f"chat n=2 streamed: {by_index}")

    # stop: the answer ends where the stop string would begin, without it.
    count = "Count to twenty: 1, 2, 3, 4, 5,"
    free = client.completions.create(model=model, prompt=count, max_tokens=40, temperature=0)
    stopped = client.completions.create(model=model, prompt=count, max_tokens=40, temperature=0,
                                        stop=[" 9", "never"])
    t, full = stopped.choices[0].text, free.choices[0].text
    print(f"      without stop: {full!r}\n      stop=' 9':    {t!r} ({stopped.choices[0].finish_reason})")
    check(" 9" in full and full.startswith(t) and full[len(t):].startswith(" 9") and
          stopped.choices[0].finish_reason == "stop", "stop: text ends just before ' 9'")
    chat_stop = client.chat.completions.create(
        model=model, temperature=0, max_tokens=64, stop=["Paris"], messages=msgs, stream=True)
    text, finish = "", None
    for chunk in chat_stop:
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    print(f"      chat stop='Paris' streamed: {text!r} ({finish})")
    check(finish == "stop" and "Paris" not in text and len(text) > 0,
          "stop (chat, streamed): ends before 'Paris'")

    # logprobs, chat and completions.
    lp = client.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=8,
                                        logprobs=True, top_logprobs=3)
    content = lp.choices[0].logprobs.content
    check(len(content) > 0 and all(e.logprob <= 0 and len(e.top_logprobs) == 3 for e in content),
          "chat logprobs: each token with 3 alternatives")
    check(all(e.top_logprobs[0].logprob >= e.logprob for e in content),
          "chat logprobs: greedy tokens are the most likely")
    print("      chat logprobs: " + ", ".join(f"{e.token!r} {e.logprob:.3f}" for e in content[:5]))
    clp = client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0,
                                    logprobs=2)
    l = clp.choices[0].logprobs
    check(len(l.tokens) == len(l.token_logprobs) == len(l.top_logprobs) == len(l.text_offset) > 0,
          "completions logprobs: tokens, token_logprobs, top_logprobs, text_offset")
    check("".join(l.tokens) == clp.choices[0].text, "completions logprobs: tokens spell the text")

    # Errors reach the client as its exception classes.
    try:
        client.chat.completions.create(model=model, messages=msgs, temperature=5)
        check(False, "bad temperature refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body.get("param") == "temperature",
              f"bad temperature: BadRequestError 400 ({e.body.get('message')})")
    try:
        OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-wrong",
               max_retries=0).models.list()
        check(False, "wrong key refused")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, "wrong API key: AuthenticationError 401")
    try:
        client.completions.create(model=model, prompt="x " * 9000, max_tokens=4)
        check(False, "prompt too long refused")
    except openai.BadRequestError as e:
        check(e.body.get("code") == "context_length_exceeded",
              f"prompt too long: BadRequestError ({e.body.get('message')})")


if __name__ == "__main__":
    main()
