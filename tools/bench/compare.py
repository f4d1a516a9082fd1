#!/usr/bin/env python3
"""The measurement loop of tools/bench/compare.sh (standard library only).

compare.sh installs the peers, makes the models and builds ferry, then runs
this with the paths it made. Every figure is measured in this one run, the
engines interleaved (the order rotates each repetition, so neither always
runs first) and repeated; report.py turns the JSON this writes into
docs/BENCHMARKS.md.

Single stream, per model:
  llama.cpp  llama-bench -m M -p 512 -n 128 -t T -r 1 -o json
             (pp512 = prefill tokens/s, tg128 = decode tokens/s)
  ferry      ferry run --raw --ignore-eos --temperature 0 --max-tokens 128
             (decode tokens/s from the speed report on stderr) and
             ferry run --raw --max-tokens 1 --prefill-chunk 512 PROMPT512
             (prefill tokens/s; PROMPT512 is exactly 512 tokens)
  mlx-lm     mlx_bench.py bench HF_DIR (its own prompt_tps / generation_tps;
             shorter prompt and generation, one run: it is slow on CPU)
Serving: each server started on a free loopback port, driven by
serve_bench.py with the same workload, then stopped.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent

# key: (GGUF file, the HF directory mlx-lm loads, description), paths under
# the models directory. mlx-lm gets unquantized weights for every row: its
# CPU backend is fastest with them (tools/peers/make-models.sh says by how
# much), so each ferry/mlx-lm ratio is against mlx-lm's best format here.
MODELS = {
    "smol-q4_1": ("SmolLM2-135M-Instruct.Q4_1.gguf", "hf/SmolLM2-135M-Instruct-f32", "SmolLM2-135M Q4_1"),
    "smol-q8_0": ("SmolLM2-135M-Instruct.Q8_0.gguf", "hf/SmolLM2-135M-Instruct-f32", "SmolLM2-135M Q8_0"),
    "smol-f16": ("SmolLM2-135M-Instruct.F16.gguf", "hf/SmolLM2-135M-Instruct-f32", "SmolLM2-135M F16"),
    "1b-q4_k_m": ("Llama-3.2-1B-shape-random.Q4_K_M.gguf", "hf/Llama-3.2-1B-shape-random-f16",
                  "1B-shaped (random) Q4_K_M"),
    "1b-q8_0": ("Llama-3.2-1B-shape-random.Q8_0.gguf", "hf/Llama-3.2-1B-shape-random-f16",
                "1B-shaped (random) Q8_0"),
}

SPEED_RE = re.compile(r"(\d+) prompt tokens, ([\d.]+) tok/s prefill \| (\d+) generated, "
                      r"([\d.]+) tok/s decode")


def log(*a) -> None:
    print("compare:", *a, file=sys.stderr, flush=True)


class Recorder:
    """Appends one JSON object per measurement to a JSONL file."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def add(self, **rec) -> None:
        rec["time"] = time.time()
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")


def run(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def cmdline(cmd: list[str]) -> str:
    """The command as the report shows it: repository paths relative, the
    home directory as ~."""
    text = " ".join(shlex.quote(c) for c in cmd)
    return text.replace(str(HERE.parent.parent) + "/", "").replace(str(Path.home()), "~")


# ------------------------------------------------------------ the machine

def cpu_busy(seconds: float = 2.0) -> float:
    """Fraction of all CPUs busy over `seconds` (from /proc/stat). Between
    measurements nothing of ours runs, so this is other processes' load."""
    def snap():
        v = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = v[3] + v[4]  # idle + iowait
        return sum(v), idle
    t0, i0 = snap()
    time.sleep(seconds)
    t1, i1 = snap()
    return 0.0 if t1 == t0 else 1.0 - (i1 - i0) / (t1 - t0)


class QuietGate:
    """Before each measurement, waits (at most --quiet-wait s) until other
    processes use less than --quiet-busy of the CPUs: on a shared 2-core
    machine one background build halves everyone's speed, and engines whose
    threads spin at barriers (llama.cpp's OpenMP) suffer far more than that."""

    def __init__(self, busy: float, wait: float):
        self.busy, self.wait = busy, wait

    def __call__(self) -> float:
        end = time.time() + self.wait
        while True:
            b = cpu_busy()
            if b <= self.busy or time.time() >= end:
                if b > self.busy:
                    log(f"machine still {b:.0%} busy after {self.wait:.0f} s; measuring anyway")
                return round(b, 3)
            time.sleep(3)

def machine_info() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version()}
    try:
        lscpu = run(["lscpu"], 30).stdout
        for key in ("Model name", "CPU(s)", "Thread(s) per core", "L3 cache", "Flags"):
            m = re.search(rf"^{re.escape(key)}:\s*(.+)$", lscpu, re.M)
            if m:
                info[key] = m.group(1).strip()
        flags = info.pop("Flags", "").split()
        info["simd"] = " ".join(f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni",
                                            "avx_vnni", "avx512_bf16") if f in flags)
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        mem = Path("/proc/meminfo").read_text()
        kb = int(re.search(r"MemTotal:\s+(\d+)", mem).group(1))
        info["memory_gib"] = round(kb / 2**20, 1)
    except (OSError, AttributeError):
        pass
    info["loadavg"] = os.getloadavg()
    try:
        info["compiler"] = run(["c++", "--version"], 30).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    return info


def model_sizes(args, keys: list[str]) -> dict:
    """Bytes of weights one decode step reads, per model, from the GGUF
    tensor table (pinned gguf-py): every tensor, except that a separate
    output.weight makes token_embd a row lookup (not counted)."""
    code = r"""
import json, sys, gguf
out = {}
for key, path in zip(sys.argv[1::2], sys.argv[2::2]):
    r = gguf.GGUFReader(path)
    sizes = {t.name: int(t.n_bytes) for t in r.tensors}
    types = sorted({t.tensor_type.name for t in r.tensors})
    total = sum(sizes.values())
    per_token = total - (sizes.get("token_embd.weight", 0) if "output.weight" in sizes else 0)
    out[key] = {"file_bytes": total, "bytes_per_token": per_token,
                "params": int(sum(int(t.n_elements) for t in r.tensors)), "types": types}
print(json.dumps(out))
"""
    argv = []
    for k in keys:
        argv += [k, str(args.models_dir / MODELS[k][0])]
    env = dict(os.environ, PYTHONPATH=args.gguf_py)
    p = run([args.python_gguf, "-c", code] + argv, 600, env=env)
    if p.returncode != 0:
        log("model sizes failed:", p.stderr[-500:])
        return {}
    return json.loads(p.stdout)


# ---------------------------------------------------------- single stream

def llama_bench(args, rec, key: str, rep: int) -> None:
    cmd = [str(args.llama_bin / "llama-bench"), "-m", str(args.models_dir / MODELS[key][0]),
           "-p", str(args.prompt_tokens), "-n", str(args.gen_tokens), "-t", str(args.threads),
           "-r", "1", "-o", "json"]
    busy = args.gate()
    p = run(cmd, 1800)
    if p.returncode != 0:
        log(f"llama-bench failed on {key}: {p.stderr[-400:]}")
        rec.add(kind="error", engine="llama.cpp", model=key, rep=rep, cmd=cmdline(cmd),
                error=p.stderr[-400:])
        return
    for t in json.loads(p.stdout):
        metric = "prefill" if t.get("n_prompt", 0) > 0 and t.get("n_gen", 0) == 0 else "decode"
        rec.add(kind="single", engine="llama.cpp", model=key, rep=rep, metric=metric,
                tps=float(t["avg_ts"]), cmd=cmdline(cmd), busy_before=busy,
                build=f"{t.get('build_commit', '?')} ({t.get('build_number', '?')})",
                backend=t.get("backends", t.get("backend", "")), cpu=t.get("cpu_info", ""))


def ferry_single(args, rec, key: str, rep: int, prompt512: str) -> None:
    model = str(args.models_dir / MODELS[key][0])
    base = [str(args.ferry), "run", "-m", model, "--raw", "--temperature", "0",
            "-t", str(args.threads)]
    jobs = [
        ("decode", base + ["--ignore-eos", "--max-tokens", str(args.gen_tokens),
                           "Once upon a time"]),
        ("prefill", base + ["--max-tokens", "1", "--prefill-chunk", str(args.prompt_tokens),
                            prompt512]),
    ]
    for metric, cmd in jobs:
        busy = args.gate()
        p = run(cmd, 1800)
        m = SPEED_RE.search(p.stderr)
        shown = cmdline(cmd[:-1]) + (" PROMPT512" if metric == "prefill" else " 'Once upon a time'")
        if p.returncode != 0 or not m:
            log(f"ferry {metric} failed on {key}: {p.stderr[-400:]}")
            rec.add(kind="error", engine="ferry", model=key, rep=rep, metric=metric, cmd=shown,
                    error=p.stderr[-400:])
            continue
        n_prompt, pre, n_gen, dec = int(m.group(1)), float(m.group(2)), int(m.group(3)), float(m.group(4))
        if metric == "decode":
            if n_gen != args.gen_tokens:
                log(f"ferry decode on {key} generated {n_gen} tokens, not {args.gen_tokens}")
            rec.add(kind="single", engine="ferry", model=key, rep=rep, metric="decode", tps=dec,
                    tokens=n_gen, cmd=shown, busy_before=busy)
        else:
            if n_prompt != args.prompt_tokens:
                log(f"ferry prefill on {key}: prompt is {n_prompt} tokens, not {args.prompt_tokens}")
            rec.add(kind="single", engine="ferry", model=key, rep=rep, metric="prefill", tps=pre,
                    tokens=n_prompt, cmd=shown, busy_before=busy)


def mlx_single(args, rec, key: str, rep: int, keys: list[str]) -> None:
    """One mlx-lm run per HF directory, recorded for every model row that
    uses that directory (several GGUF formats share one mlx-lm model)."""
    d = args.models_dir / MODELS[key][1]
    rows = [k for k in keys if MODELS[k][1] == MODELS[key][1]]
    cmd = [str(args.mlx_bin / "python"), str(HERE / "mlx_bench.py"), "bench", str(d),
           "--prompt-tokens", str(args.mlx_prompt_tokens), "--gen-tokens", str(args.mlx_gen_tokens)]
    busy = args.gate()
    p = run(cmd, 3600, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    if p.returncode != 0:
        log(f"mlx-lm failed on {key}: {p.stderr[-400:]}")
        rec.add(kind="error", engine="mlx-lm", model=key, rep=rep, cmd=cmdline(cmd),
                error=p.stderr[-400:])
        return
    r = json.loads(p.stdout.strip().splitlines()[-1])
    for row in rows:
        for metric, field in (("prefill", "prefill_tps"), ("decode", "decode_tps")):
            for v in r[field]:
                rec.add(kind="single", engine="mlx-lm", model=row, rep=rep, metric=metric, tps=v,
                        cmd=cmdline(cmd), busy_before=busy, mlx_model=MODELS[key][1],
                        tokens=r["prompt_tokens" if metric == "prefill" else "gen_tokens"])


# ------------------------------------------------------------------ serving

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            return False
        for path in ("/health", "/v1/models"):
            try:
                with urllib.request.urlopen(url + path, timeout=5) as r:
                    if r.status == 200:
                        return True
            except OSError:
                pass
        time.sleep(1)
    return False


def server_command(args, engine: str, port: int) -> list[str]:
    key = args.serve_model
    gguf = str(args.models_dir / MODELS[key][0])
    n = args.serve_concurrency
    ctx_per_slot = args.serve_prompt + args.serve_max_tokens + 64
    if engine == "ferry":
        return [str(args.ferry), "serve", "-m", gguf, "--host", "127.0.0.1", "--port", str(port),
                "-t", str(args.threads), "--max-batch", str(n),
                "--max-connections", str(4 * n), "-q"]
    if engine == "llama.cpp":
        return [str(args.llama_bin / "llama-server"), "-m", gguf, "--host", "127.0.0.1",
                "--port", str(port), "-t", str(args.threads), "-np", str(n), "-cb",
                "-c", str(n * ctx_per_slot), "--no-webui", "--log-disable"]
    if engine == "mlx-lm":
        d = str(args.models_dir / MODELS[key][1])
        return [str(args.mlx_bin / "python"), str(HERE / "mlx_bench.py"), "server",
                "--model", d, "--host", "127.0.0.1", "--port", str(port),
                "--decode-concurrency", str(n), "--prompt-concurrency", str(n),
                "--max-tokens", str(args.serve_max_tokens)]
    raise ValueError(engine)


def serve_one(args, rec, engine: str, rep: int) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = server_command(args, engine, port)
    logf = open(args.out_dir / f"server-{engine}-{rep}.log", "w")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    try:
        if not wait_healthy(url, proc, 600):
            log(f"{engine} server did not come up (log: {logf.name})")
            rec.add(kind="error", engine=engine, model=args.serve_model, rep=rep, metric="serve",
                    cmd=cmdline(cmd), error="server did not become healthy")
            return
        busy = args.gate()
        requests = args.mlx_serve_requests if engine == "mlx-lm" else args.serve_requests
        out = args.out_dir / f"serve-{engine}-{rep}.json"
        bench = [str(args.bench_python), str(HERE / "serve_bench.py"), "--url", url,
                 "--requests", str(requests), "--concurrency", str(args.serve_concurrency),
                 "--prompt-tokens", str(args.serve_prompt), "--max-tokens", str(args.serve_max_tokens),
                 "--tokenizer", str(args.tokenizer), "--label", engine, "--json-out", str(out)]
        p = run(bench, 3600)
        if not out.exists():
            log(f"serve_bench failed on {engine}: {p.stderr[-400:]}")
            rec.add(kind="error", engine=engine, model=args.serve_model, rep=rep, metric="serve",
                    cmd=cmdline(bench), error=p.stderr[-400:])
            return
        r = json.loads(out.read_text())
        log(f"serve {engine} rep {rep}: {r['output_tokens_per_s']} tok/s, "
            f"ITL p99 {r['itl_ms']['p99']} ms, failed {r['failed']}")
        rec.add(kind="serve", engine=engine, model=args.serve_model, rep=rep, result=r, busy_before=busy,
                server_cmd=cmdline(cmd), client_cmd=cmdline(bench).replace(url, "URL"))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        logf.close()


def has_serve(ferry: Path) -> bool:
    p = run([str(ferry), "--help"], 60)
    return re.search(r"^\s+serve\b", p.stdout + p.stderr, re.M) is not None


def make_prompt(args, n: int) -> str:
    p = run([str(args.bench_python), str(HERE / "serve_bench.py"), "--url", "http://127.0.0.1:1",
             "--tokenizer", str(args.tokenizer), "--prompt-tokens", str(n), "--print-prompt"], 300)
    if p.returncode != 0:
        sys.exit(f"compare: cannot make the {n}-token prompt: {p.stderr[-400:]}")
    return p.stdout.rstrip("\n")


def rotate(xs: list, k: int) -> list:
    k %= max(1, len(xs))
    return xs[k:] + xs[:k]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    P = Path
    ap.add_argument("--out-dir", type=P, required=True)
    ap.add_argument("--ferry", type=P, required=True)
    ap.add_argument("--llama-bin", type=P, required=True)
    ap.add_argument("--mlx-bin", type=P, default=None, help="mlx-lm venv bin/ (omit: no mlx-lm)")
    ap.add_argument("--models-dir", type=P, required=True)
    ap.add_argument("--tokenizer", type=P, required=True, help="SmolLM2 tokenizer.json")
    ap.add_argument("--bench-python", type=P, required=True, help="python with aiohttp, tokenizers")
    ap.add_argument("--python-gguf", required=True, help="python with numpy (for gguf-py)")
    ap.add_argument("--gguf-py", required=True, help="the pinned gguf-py directory")
    ap.add_argument("--roofline", type=P, required=True)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    # mlx-lm on this CPU runs at 0.5-10 tokens/s: shorter runs, once each.
    ap.add_argument("--mlx-reps", type=int, default=1)
    ap.add_argument("--mlx-prompt-tokens", type=int, default=128)
    ap.add_argument("--mlx-gen-tokens", type=int, default=32)
    ap.add_argument("--mlx-serve", action="store_true",
                    help="also serve with mlx_lm.server (minutes per run at 16 streams)")
    ap.add_argument("--serve-model", default="smol-q4_1")
    ap.add_argument("--serve-reps", type=int, default=3)
    ap.add_argument("--serve-requests", type=int, default=48)
    ap.add_argument("--mlx-serve-requests", type=int, default=16)
    ap.add_argument("--mlx-serve-reps", type=int, default=1)
    ap.add_argument("--serve-concurrency", type=int, default=16)
    ap.add_argument("--serve-prompt", type=int, default=128)
    ap.add_argument("--serve-max-tokens", type=int, default=128)
    ap.add_argument("--quiet-busy", type=float, default=0.15,
                    help="wait until other processes use less than this CPU fraction")
    ap.add_argument("--quiet-wait", type=float, default=180.0, help="longest wait, seconds")
    ap.add_argument("--skip-single", action="store_true")
    ap.add_argument("--skip-serve", action="store_true")
    args = ap.parse_args()

    args.out_dir.mkdir(parents=True, exist_ok=True)
    args.gate = QuietGate(args.quiet_busy, args.quiet_wait)
    rec = Recorder(args.out_dir / "results.jsonl")
    keys = [k for k in args.models.split(",") if k]
    for k in keys:
        if k not in MODELS:
            sys.exit(f"compare: unknown model '{k}' (known: {', '.join(MODELS)})")
    # The first row of each mlx-lm directory triggers its one run.
    mlx_first = {}
    if args.mlx_bin:
        for k in keys:
            mlx_first.setdefault(MODELS[k][1], k)

    info = machine_info()
    p = run([str(args.ferry), "--version"], 60)
    info["ferry_version"] = (p.stdout + p.stderr).strip()
    rec.add(kind="machine", info=info, argv=sys.argv[1:])
    rec.add(kind="models", sizes=model_sizes(args, keys))

    log("roofline")
    args.gate()
    p = run([str(args.roofline), "--json"], 900)
    if p.returncode == 0:
        rec.add(kind="roofline", result=json.loads(p.stdout), cmd=cmdline([str(args.roofline), "--json"]))
    else:
        log("roofline failed:", p.stderr[-400:])

    if not args.skip_single:
        prompt512 = make_prompt(args, args.prompt_tokens)
        for rep in range(args.reps):
            for key in keys:
                mlx = rep < args.mlx_reps and mlx_first.get(MODELS[key][1]) == key
                engines = ["llama.cpp", "ferry"] + (["mlx-lm"] if mlx else [])
                for eng in rotate(engines, rep):
                    log(f"single rep {rep + 1}/{args.reps} {key} {eng}")
                    if eng == "llama.cpp":
                        llama_bench(args, rec, key, rep)
                    elif eng == "ferry":
                        ferry_single(args, rec, key, rep, prompt512)
                    else:
                        mlx_single(args, rec, key, rep, keys)

    if not args.skip_serve:
        engines = ["llama.cpp"]
        if has_serve(args.ferry):
            engines.insert(0, "ferry")
        else:
            log("ferry has no serve subcommand yet; serving is measured for the peers only")
            rec.add(kind="note", text="ferry serve did not exist in this build")
        if args.mlx_bin and args.mlx_serve:
            engines.append("mlx-lm")
        for rep in range(args.serve_reps):
            for eng in rotate(engines, rep):
                if eng == "mlx-lm" and rep >= args.mlx_serve_reps:
                    continue
                log(f"serve rep {rep + 1}/{args.serve_reps} {eng}")
                serve_one(args, rec, eng, rep)

    info_end = {"loadavg": os.getloadavg()}
    rec.add(kind="end", info=info_end)
    print(rec.path)


if __name__ == "__main__":
    main()
