#!/usr/bin/env python3
"""Makes tests/data/kv_quant/goldens.json: what MLX's affine quantizer
(mlx.core.quantize / mlx.core.dequantize, mode "affine", CPU stream) makes of
fixed float16 test matrices, for ferry's src/kv/affine_quant.{h,cpp}.

Inputs are float16 matrices [rows, head_dim] for head_dim 64 and 128: edge-case
rows (all-zero, mixed +0/-0, all-equal, |min| > |max| and the reverse, |min| ==
|max|, ranges below 1e-7 made of f16 subnormals, magnitudes up to f16 max,
codes exactly at rounding midpoints, near-ties in q0) and seeded random rows.
Every (bits, group) in {4, 8} x {32, 64, 128} with group <= head_dim is a case.

Per case it records (all integers, so the C++ side compares bit patterns):
  packed       mx.quantize's uint32 words, row-major [rows, head_dim*bits/32]
  scales       f16 bit patterns [rows, head_dim/group]
  biases       f16 bit patterns [rows, head_dim/group]
  dequant_f16  mx.dequantize(packed, scales, biases) f16 bit patterns
  dequant_f32  mx.dequantize with scales and biases widened to float32, f32
               bit patterns (MLX computing scale * q + bias in float32)

Before writing, the script checks MLX against an independent numpy model of
the seed README's rules (float32 arithmetic, codes from the float32 scale and
bias, scale and bias rounded to f16 only when stored) and fails if any bit
differs. It also checks that the goldens tell that model apart from two
plausible variants (codes from the f16-rounded scale and bias; the range
w_max - w_min taken in f16), and that mx.dequantize's f16 output is
f16(f16(scale * q) + bias), not f16(scale * q + bias).

Usage (pinned version: tools/goldens/requirements.txt):
  python3 tools/goldens/kv_quant_goldens.py [--out PATH]
"""

import argparse
import json
from collections import Counter
from pathlib import Path

import mlx.core as mx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "tests/data/kv_quant/goldens.json"

HEAD_DIMS = (64, 128)
BITS = (4, 8)
GROUPS = (32, 64, 128)
SEED = 20240611

F16_MAX = 65504.0
f16 = np.float16
f32 = np.float32


# ---------------------------------------------------------------- inputs


def h(bits):
    """f16 values from bit patterns."""
    return np.asarray(bits, dtype=np.uint16).view(f16)


def tile_chunks(head_dim, make_chunk):
    """A row built from 32-value chunks; every chunk carries the row's
    defining values, so groups of 32, 64 and 128 all see them."""
    return np.concatenate([make_chunk(c) for c in range(head_dim // 32)]).astype(f16)


def edge_rows(head_dim, rng):
    rows = {}
    n = head_dim

    def with_fixed(fixed, fill):
        def chunk(_):
            c = np.asarray(fill(32), dtype=f16)
            pos = rng.permutation(32)[: len(fixed)]
            c[pos] = np.asarray(fixed, dtype=f16)
            return c

        return tile_chunks(n, chunk)

    rows["zeros"] = np.zeros(n, f16)
    rows["signed_zeros"] = np.where(rng.random(n) < 0.5, f16(0.0), f16(-0.0)).astype(f16)
    rows["all_equal_pos"] = np.full(n, 0.7, f16)
    rows["all_equal_neg"] = np.full(n, -3.5, f16)
    rows["all_equal_f16_max"] = np.full(n, F16_MAX, f16)
    rows["minus15_to_0"] = np.tile(np.arange(-15, 1, dtype=f16), n // 16)  # scale 1
    rows["0_to_15"] = np.tile(np.arange(0, 16, dtype=f16), n // 16)  # scale -1
    rows["min_edge"] = with_fixed([-4.0, 1.0], lambda k: rng.uniform(-4, 1, k))
    rows["max_edge"] = with_fixed([-1.0, 4.0], lambda k: rng.uniform(-1, 4, k))
    rows["abs_tie"] = with_fixed([-2.0, 2.0], lambda k: rng.uniform(-2, 2, k))
    # |min| one f16 ulp above |max|.
    rows["abs_min_by_one_ulp"] = with_fixed([-2.001953125, 2.0], lambda k: rng.uniform(-2, 2, k))
    # Ranges below 1e-7: f16 subnormals (smallest is 2^-24 ~ 5.96e-8).
    rows["subnormal_tiny"] = h(rng.choice([0x0000, 0x0001, 0x8001], n))
    rows["subnormal_pos"] = h(rng.integers(0x0001, 0x0009, n))
    rows["subnormal_neg"] = h(rng.integers(0x8001, 0x8009, n))
    # Ranges of a few ulps far from zero: range / 15 just above 1e-7 and
    # range / 255 clamped (1e-3); |q0| in the hundreds or thousands (-1e-2).
    rows["few_ulps_1e-3"] = h(0x1419 + rng.integers(0, 3, n))
    rows["few_ulps_neg_1e-2"] = h(0xA11F + rng.integers(0, 30, n))
    rows["f16_max_mixed"] = with_fixed([-F16_MAX, F16_MAX],
                                       lambda k: rng.uniform(-F16_MAX, F16_MAX, k))
    rows["f16_max_pos"] = with_fixed([60000.0, F16_MAX], lambda k: rng.uniform(60000, F16_MAX, k))
    rows["f16_max_neg"] = with_fixed([-F16_MAX, -30000.0],
                                     lambda k: rng.uniform(-F16_MAX, -30000, k))
    # Codes exactly at .5 (scale +-1 or 17 is exact, so (w - bias) / scale is
    # exactly k + 0.5 and rint must round half to even).
    halves15 = np.arange(15) + 0.5
    rows["mid4_min_edge"] = with_fixed([-15.0, 0.0], lambda k: rng.choice(-halves15, k))
    rows["mid4_max_edge"] = with_fixed([0.0, 15.0], lambda k: rng.choice(halves15, k))
    rows["mid8_min_edge"] = with_fixed([-255.0, 0.0], lambda k: -rng.integers(0, 255, k) - 0.5)
    rows["mid8_max_edge"] = with_fixed([0.0, 255.0], lambda k: rng.integers(0, 255, k) + 0.5)
    halves17 = -255 + 17 * np.arange(15) + 8.5
    rows["mid4_scale17"] = with_fixed([-255.0, 0.0], lambda k: rng.choice(halves17, k))
    # edge / scale close to a .5 tie for q0 (4 bits: 15*7/10 = 10.5).
    rows["q0_near_tie"] = with_fixed([-3.0, 7.0], lambda k: rng.uniform(-3, 7, k))
    return rows


def random_rows(head_dim, rng):
    rows = {}
    for i in range(4):
        rows[f"normal_{i}"] = rng.standard_normal(head_dim).astype(f16)
    rows["normal_small"] = (rng.standard_normal(head_dim) * 0.05).astype(f16)
    rows["normal_large"] = (rng.standard_normal(head_dim) * 100).astype(f16)
    rows["laplace"] = rng.laplace(0, 2, head_dim).astype(f16)
    spikes = rng.random(head_dim) < 0.05
    rows["outlier"] = np.where(spikes, 60.0, rng.standard_normal(head_dim)).astype(f16)
    for i in range(2):
        b = rng.integers(0, 0x10000, head_dim, dtype=np.uint32).astype(np.uint16)
        b[(b & 0x7C00) == 0x7C00] &= 0xBFFF  # no inf or NaN: clear the top exponent bit
        rows[f"random_bits_{i}"] = h(b)
    return rows


def make_inputs(head_dim):
    rng = np.random.default_rng(SEED + head_dim)
    rows = edge_rows(head_dim, rng)
    rows.update(random_rows(head_dim, rng))
    names = list(rows)
    x = np.stack([rows[k] for k in names]).astype(f16)
    check(x.shape == (len(names), head_dim) and np.isfinite(x).all(), "inputs must be finite")
    return names, x


# ------------------------------------------------------ numpy model of MLX


def model_quantize(x, bits, group, codes_from_f16=False, range_in_f16=False, coverage=None):
    """The seed README's rules on float16 input x [rows, head_dim]; returns
    (packed uint32, scales f16, biases f16). The two flags select variants
    that the goldens must be able to reject; coverage, a Counter, counts the
    edge cases met."""
    g16 = x.reshape(-1, group)
    g = g16.astype(f32)
    n_bins = f32(2**bits - 1)
    w_min, w_max = g.min(axis=1), g.max(axis=1)
    mask = np.abs(w_min) > np.abs(w_max)
    with np.errstate(all="ignore"):
        rng_ = (g16.max(axis=1) - g16.min(axis=1)).astype(f32) if range_in_f16 else w_max - w_min
        scale = np.maximum(rng_ / n_bins, f32(1e-7)).astype(f32)
        scale = np.where(mask, scale, -scale).astype(f32)
        edge = np.where(mask, w_min, w_max).astype(f32)
        q0 = np.rint(edge / scale).astype(f32)
        nz = q0 != 0
        scale = np.where(nz, edge / np.where(nz, q0, f32(1)), scale).astype(f32)
        bias = np.where(nz, edge, f32(0)).astype(f32)
        s16, b16 = scale.astype(f16), bias.astype(f16)
        sc, bc = (s16.astype(f32), b16.astype(f32)) if codes_from_f16 else (scale, bias)
        q = np.clip(np.rint((g - bc[:, None]) / sc[:, None]), 0, n_bins).astype(np.uint32)
    per_word = 32 // bits
    q = q.reshape(-1, per_word)
    words = np.zeros(q.shape[0], np.uint32)
    for k in range(per_word):
        words |= q[:, k] << np.uint32(k * bits)
    rows = x.shape[0]
    if coverage is not None:
        ratio = (g - bc[:, None]) / sc[:, None]
        coverage["min_edge"] += int(mask.sum())
        coverage["max_edge"] += int((~mask).sum())
        coverage["scale_clamped"] += int((rng_ / n_bins < f32(1e-7)).sum())
        coverage["q0_zero"] += int((~nz).sum())
        coverage["code_ties"] += int(((ratio - np.floor(ratio)) == 0.5).sum())
        coverage["codes_clipped"] += int(((ratio < -0.5) | (ratio > n_bins + 0.5)).sum())
    return words.reshape(rows, -1), s16.reshape(rows, -1), b16.reshape(rows, -1)


def unpack(packed, bits):
    per_word = 32 // bits
    mask = np.uint32(2**bits - 1)
    q = np.stack([(packed >> np.uint32(k * bits)) & mask for k in range(per_word)], axis=-1)
    return q.reshape(packed.shape[0], -1).astype(f32)


def model_dequantize_f16(packed, scales, biases, bits, group):
    """f16(f16(scale * q) + bias): f16 ops done in float32 and rounded."""
    q = unpack(packed, bits)
    s = np.repeat(scales.astype(f32), group, axis=1)
    b = np.repeat(biases.astype(f32), group, axis=1)
    with np.errstate(over="ignore"):
        return ((s * q).astype(f16).astype(f32) + b).astype(f16)


def model_dequantize_once(packed, scales, biases, bits, group):
    """f16(scale * q + bias) with one rounding: what MLX does NOT do."""
    q = unpack(packed, bits)
    s = np.repeat(scales.astype(f32), group, axis=1)
    b = np.repeat(biases.astype(f32), group, axis=1)
    with np.errstate(over="ignore"):
        return (s * q + b).astype(f16)


# ------------------------------------------------------------------ main


def u16(a):
    return np.ascontiguousarray(a).view(np.uint16).reshape(-1).tolist()


def u32(a):
    return np.ascontiguousarray(a).view(np.uint32).reshape(-1).tolist()


def diff(a, b):
    """Number of differing bytes between two arrays' bit patterns."""
    a, b = (np.ascontiguousarray(v).view(np.uint8) for v in (a, b))
    return int((a != b).sum())


def check(ok, message):
    """A failed self-check stops the script (unlike assert, not skipped by -O)."""
    if not ok:
        raise SystemExit(f"kv_quant_goldens: {message}")


def make_case(x, head_dim, bits, group, variant_diffs, coverage):
    """Runs MLX on x, checks it against the numpy model, returns the case."""
    wq, s, b = mx.quantize(mx.array(x), group_size=group, bits=bits)
    d16 = mx.dequantize(wq, s, b, group_size=group, bits=bits)
    s32, b32 = s.astype(mx.float32), b.astype(mx.float32)
    d32 = mx.dequantize(wq, s32, b32, group_size=group, bits=bits)
    wq, s, b, d16, d32 = (np.array(a) for a in (wq, s, b, d16, d32))
    check(s.dtype == f16 and b.dtype == f16 and d16.dtype == f16 and d32.dtype == f32, "dtypes")

    tag = f"head_dim {head_dim} bits {bits} group {group}"
    mw, ms, mb = model_quantize(x, bits, group, coverage=coverage)
    check(diff(mw, wq) == 0 and diff(ms, s) == 0 and diff(mb, b) == 0, f"model != MLX: {tag}")
    d16_model = model_dequantize_f16(wq, s, b, bits, group)
    check(diff(d16_model, d16) == 0, f"dequant f16 model != MLX: {tag}")
    q = unpack(wq, bits)
    exact = np.repeat(s.astype(f32), group, 1) * q + np.repeat(b.astype(f32), group, 1)
    check(diff(exact.astype(f32), d32) == 0, f"dequant f32 model != MLX: {tag}")

    wq_codes_f16 = model_quantize(x, bits, group, codes_from_f16=True)[0]
    variant_diffs["codes_from_f16"] += diff(wq_codes_f16, wq)
    range_f16 = model_quantize(x, bits, group, range_in_f16=True)
    variant_diffs["range_in_f16"] += sum(diff(m, g) for m, g in zip(range_f16, (wq, s, b)))
    d16_once = model_dequantize_once(wq, s, b, bits, group)
    variant_diffs["dequant_rounded_once"] += diff(d16_once, d16)
    coverage["dequant_f16_overflow"] += int(np.isinf(d16).sum())

    return {
        "head_dim": head_dim, "bits": bits, "group": group,
        "packed": u32(wq), "scales": u16(s), "biases": u16(b),
        "dequant_f16": u16(d16), "dequant_f32": u32(d32),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)

    inputs, cases = {}, []
    variant_diffs = {"codes_from_f16": 0, "range_in_f16": 0, "dequant_rounded_once": 0}
    coverage = Counter()
    for head_dim in HEAD_DIMS:
        names, x = make_inputs(head_dim)
        inputs[str(head_dim)] = {"rows": len(names), "row_names": names, "f16": u16(x)}
        for bits in BITS:
            for group in (g for g in GROUPS if g <= head_dim):
                cases.append(make_case(x, head_dim, bits, group, variant_diffs, coverage))
    # The goldens must reject each variant, or they prove nothing about it.
    for k, v in variant_diffs.items():
        check(v > 0, f"goldens cannot tell the {k} variant from MLX")
    # And must meet every edge case they claim to.
    for k in ("min_edge", "max_edge", "scale_clamped", "q0_zero", "code_ties", "codes_clipped",
              "dequant_f16_overflow"):
        check(coverage[k] > 0, f"no golden exercises {k}")

    doc = {
        "generator": "tools/goldens/kv_quant_goldens.py",
        "reference": f"mlx {mx.__version__} mx.quantize / mx.dequantize, affine, CPU",
        "seed": SEED,
        "inputs": inputs,
        "cases": cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        # One case per line: small diffs when the reference changes.
        f.write("{\n")
        keys = [k for k in doc if k != "cases"]
        for k in keys:
            f.write(f"{json.dumps(k)}: {json.dumps(doc[k], separators=(',', ':'))},\n")
        f.write('"cases": [\n')
        f.write(",\n".join(json.dumps(c, separators=(",", ":")) for c in cases))
        f.write("\n]\n}\n")
    print(f"wrote {args.out}: {len(cases)} cases")
    print(f"bytes differing from MLX per rejected variant: {variant_diffs}")
    print(f"edge cases met (groups or values): {dict(coverage)}")


if __name__ == "__main__":
    main()
