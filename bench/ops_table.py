#!/usr/bin/env python3
"""Turns kv_ops_bench's JSON (--benchmark_out, with repetitions) into the
markdown tables of docs/KV_MEASUREMENTS.md: per op, one row per (B, C),
f16 and q4g64 side by side, median CPU time per call and the copy rate
(KV bytes copied per CPU second, GB = 1e9 bytes).

usage: bench/ops_table.py kv_ops.json [more.json ...]   (later files win)
"""
import json
import sys
from collections import defaultdict


def fmt_time(us):
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.2f} µs" if us < 10 else f"{us:.0f} µs"


def main(paths):
    benchmarks = []
    for path in paths:
        benchmarks += json.load(open(path))["benchmarks"]
    med = {}
    for b in benchmarks:
        if b.get("aggregate_name") != "median":
            continue
        # Drop suffixes such as "/iterations:75".
        name = "/".join(p for p in b["run_name"].split("/") if ":" not in p or p[:2] in ("B:", "C:"))
        scale = {"us": 1.0, "ms": 1e3, "ns": 1e-3, "s": 1e6}[b["time_unit"]]
        med[name] = {
            "cpu_us": b["cpu_time"] * scale,
            "real_us": b["real_time"] * scale,
            "copied": b.get("copied", 0.0),
            "zeroed": b.get("zeroed", 0.0),
        }
    ops = defaultdict(dict)
    for name, m in med.items():
        parts = name.split("/")
        if parts[0] == "memcpy":
            ops["memcpy"][(int(parts[1]),)] = m
            continue
        op, f, B, C = parts[0], parts[1], int(parts[2][2:]), int(parts[3][2:])
        ops[op].setdefault((B, C), {})[f] = m
    if "memcpy" in ops:
        print("### memcpy\n\n| bytes | CPU time | real time | GB/s (CPU) |\n|---|---|---|---|")
        for (n,), m in sorted(ops.pop("memcpy").items()):
            print(f"| {n / 2**20:.0f} MiB | {fmt_time(m['cpu_us'])} | {fmt_time(m['real_us'])} "
                  f"| {n / m['cpu_us'] / 1e3:.1f} |")
        print()
    order = ["alloc", "alloc_cold", "merge", "extend_inplace", "extend_rebuild", "filter_first",
             "filter_last", "extract", "align", "spec_round"]
    for op in order:
        if op not in ops:
            continue
        print(f"### {op}\n")
        print("| B | C | f16 MiB copied | f16 CPU (real) | f16 GB/s | q4g64 MiB copied "
              "| q4g64 CPU (real) | q4g64 GB/s |")
        print("|---|---|---|---|---|---|---|---|")
        for (B, C), fm in sorted(ops[op].items()):
            cells = []
            for f in ("f16", "q4g64"):
                m = fm.get(f)
                if not m:
                    cells += ["—", "skipped (memory)", "—"]
                    continue
                moved = m["copied"] or m["zeroed"]
                rate = f"{moved / m['cpu_us'] / 1e3:.1f}" if moved else "—"
                mib = f"{m['copied'] / 2**20:.1f}" if m["copied"] else (
                    f"0 (zeroed {m['zeroed'] / 2**20:.1f})" if m["zeroed"] else "0")
                cells += [mib, f"{fmt_time(m['cpu_us'])} ({fmt_time(m['real_us'])})", rate]
            print(f"| {B} | {C} | " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
