#!/usr/bin/env python3
"""Checks the chat page of `ferry serve` in headless Chromium (Debian's
`chromium`), through the DevTools protocol.

    apt-get install chromium && pip install websocket-client==1.8.0
    python3 tools/chat_page_check.py [--ferry build/ferry] [--model M.gguf] [--png out.png]

Starts the server on a free port, opens /?q=QUESTION (the page's test hook
sends QUESTION on load), samples the assistant's text while it streams,
waits for <body data-state="done">, saves a screenshot and prints what it
saw. Fails unless the answer arrived in several growing pieces.
"""
import argparse
import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import websocket


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(ferry, model):
    proc = subprocess.Popen([ferry, "serve", "-m", model, "--port", "0", "-q"],
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        m = re.search(r"on http://[^:]+:(\d+)", line)
        if m:
            return proc, int(m.group(1))
    sys.exit("server did not start")


class Tab:
    """One page over the DevTools websocket."""

    def __init__(self, devtools_port, url):
        deadline = time.time() + 30
        while True:
            try:
                req = urllib.request.Request(
                    f"http://127.0.0.1:{devtools_port}/json/new?{urllib.parse.quote(url, safe='')}",
                    method="PUT")
                info = json.load(urllib.request.urlopen(req))
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        self.ws = websocket.create_connection(info["webSocketDebuggerUrl"], timeout=30)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg["result"]

    def eval(self, expr):
        return self.call("Runtime.evaluate", expression=expr, returnByValue=True)["result"].get("value")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--ferry", default=os.path.join(root, "build", "ferry"))
    ap.add_argument("--model", default=os.environ.get("FERRY_MODEL", os.path.expanduser(
        "~/.cache/ferry/models/SmolLM2-135M-Instruct.Q4_1.gguf")))
    ap.add_argument("--question", default="Write a short poem about the sea.")
    ap.add_argument("--png", default="chat_page.png")
    args = ap.parse_args()

    server, port = start_server(args.ferry, args.model)
    devtools = free_port()
    profile = tempfile.mkdtemp(prefix="ferry-chromium-")
    browser = subprocess.Popen(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1000,700",
         f"--remote-debugging-port={devtools}", f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        q = urllib.parse.quote(args.question)
        tab = Tab(devtools, f"http://127.0.0.1:{port}/?q={q}&temperature=0&max_tokens=120")
        samples = []
        deadline = time.time() + 120
        state = None
        while time.time() < deadline:
            state = tab.eval("document.body.dataset.state")
            text = tab.eval("(document.querySelector('.assistant .text') || {}).textContent || ''")
            if text and (not samples or samples[-1] != text):
                samples.append(text)
            if state == "done":
                break
            time.sleep(0.03)
        log = tab.eval("document.getElementById('log').innerText")
        model = tab.eval("document.getElementById('model').textContent")
        shot = tab.call("Page.captureScreenshot", format="png")
        with open(args.png, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        errors = tab.eval("document.querySelectorAll('.msg.error').length")
    finally:
        browser.terminate()
        browser.wait()
        shutil.rmtree(profile, ignore_errors=True)
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)

    print(f"model shown: {model}")
    print(f"page state: {state}; distinct texts seen while streaming: {len(samples)}")
    for s in samples[:4]:
        print(f"  partial: {s[:70]!r}")
    print("conversation in #log:\n" + log)
    print(f"screenshot: {args.png}")
    growing = all(b.startswith(a) for a, b in zip(samples, samples[1:]))
    ok = state == "done" and errors == 0 and len(samples) >= 3 and growing and samples[-1].strip()
    print("chat page check " + ("passed" if ok else "FAILED"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
