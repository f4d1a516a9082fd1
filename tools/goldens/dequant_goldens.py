#!/usr/bin/env python3
"""Dequantize / quantize goldens from gguf-py (llama.cpp's own Python package).

Dev-time only.  Writes tests/data/dequant/:

  <type>.bin             raw GGUF/ggml blocks (n_blocks * type_size bytes), random with a
                         fixed seed; every fp16 scale field is a finite, moderate value
                         (block 0 uses a subnormal fp16 scale, block 1 a zero scale)
  <type>.f32             gguf.quants.dequantize(<type>.bin): n_blocks * block_size float32 LE
  <type>.quant_in.f32    (types gguf-py can quantize) input floats, float32 LE
  <type>.quant_out.bin   gguf.quants.quantize(input): the bytes llama.cpp's reference
                         quantize_row_*_ref produces (gguf-py is bit-exact with it)
  index.json             per type: block_size, type_size, n_blocks, file names, and which
                         gguf-py operation made them

<type> is the lower-case ggml name: f16 bf16 q8_0 q4_0 q4_1 q4_k q5_k q6_k.
For f16/bf16 a "block" is one element (block_size 1, type_size 2).

gguf-py 0.19.0 has no quantizer for Q4_K/Q5_K/Q6_K, so those have dequant goldens only.

Usage:  python3 tools/goldens/dequant_goldens.py [--out tests/data/dequant]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
SEED = 4242
N_BLOCKS = 8
N_ELEMS_FLOAT = 256  # f16 / bf16 element count

TYPES = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"]
# byte offsets of the fp16 scale fields inside one block
FP16_FIELDS = {
    "Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2],       # d | d, m
    "Q4_K": [0, 2], "Q5_K": [0, 2],                   # d, dmin
    "Q6_K": [208],                                    # d (after ql[128] qh[64] scales[16])
}


def moderate_f16(rng, n: int) -> np.ndarray:
    mag = np.exp(rng.uniform(np.log(1e-3), np.log(4.0), size=n))
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return (mag * sign).astype(np.float16)


def random_blocks(qt, rng) -> np.ndarray:
    import gguf

    name = qt.name
    if name == "F16":
        bits = rng.integers(0, 1 << 16, size=N_ELEMS_FLOAT, dtype=np.uint32).astype(np.uint16)
        bits = np.where((bits & 0x7C00) == 0x7C00, bits & 0xBFFF, bits).astype(np.uint16)  # no inf/nan
        specials = [0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C00, 0xBC00, 0x8001]
        bits[: len(specials)] = specials
        return bits.view(np.uint8).copy()
    if name == "BF16":
        bits = rng.integers(0, 1 << 16, size=N_ELEMS_FLOAT, dtype=np.uint32).astype(np.uint16)
        bits = np.where((bits & 0x7F80) == 0x7F80, bits & 0xBFFF, bits).astype(np.uint16)  # no inf/nan
        specials = [0x0000, 0x8000, 0x0001, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x3F80, 0xBF80, 0x8001]
        bits[: len(specials)] = specials
        return bits.view(np.uint8).copy()
    block_size, type_size = gguf.GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, size=(N_BLOCKS, type_size), dtype=np.uint16).astype(np.uint8)
    for off in FP16_FIELDS[name]:
        vals = moderate_f16(rng, N_BLOCKS)
        vals[0] = np.uint16(0x0005).view(np.float16)  # subnormal scale
        if off == FP16_FIELDS[name][0]:
            vals[1] = np.float16(0.0)                  # zero scale -> that term is 0
        raw[:, off:off + 2] = vals.view(np.uint8).reshape(N_BLOCKS, 2)
    return raw


def quant_inputs(name: str, rng) -> np.ndarray:
    if name in ("F16", "BF16"):
        x = (rng.standard_normal(N_ELEMS_FLOAT) * np.exp(rng.uniform(-8, 8, N_ELEMS_FLOAT))).astype(np.float32)
        if name == "F16":
            special = [0.0, -0.0, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, -(1.0 + 2.0 ** -11), 65504.0, 65519.0,
                       65520.0, 1e-8, 6e-8, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 1e6, -1e6]
        else:
            special = [0.0, -0.0, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, -(1.0 + 2.0 ** -8), 3.0e38, 3.4e38,
                       1e-40, -1e-45, 1.17549435e-38]
        x[: len(special)] = np.array(special, dtype=np.float32)
        if name == "BF16":
            x[len(special)] = np.uint32(0x7F800001).view(np.float32)  # signalling NaN -> quiet (ggml rule)
            x[len(special) + 1] = np.float32(np.inf)
            x[len(special) + 2] = np.float32(-np.inf)
        return x
    bs = 32
    blocks = []
    blocks.append(rng.standard_normal(bs))                                   # 0 plain
    blocks.append(np.zeros(bs))                                              # 1 all zero (d == 0 path)
    b = np.zeros(bs); b[5] = -3.25; blocks.append(b)                         # 2 single negative spike
    blocks.append(np.full(bs, 0.7))                                          # 3 constant (Q4_1: d == 0)
    blocks.append(np.concatenate([[-8.0], np.arange(-7.5, 7.6, 0.5)[:bs - 1]]))  # 4 half-integer ties
    blocks.append(rng.standard_normal(bs) * 1e-3)                            # 5 small
    blocks.append(rng.standard_normal(bs) * 1e3)                             # 6 large
    blocks.append(rng.uniform(5.0, 6.0, bs))                                 # 7 offset, all positive
    b = np.round(rng.standard_normal(bs) * 127) / 127 * 2.0; b[0] = 2.0      # 8 grid values (Q8_0 ties)
    blocks.append(b)
    x = np.concatenate(blocks).astype(np.float32)
    assert x.size == 9 * bs
    return x


def can_quantize(qt) -> bool:
    import gguf

    block_size, _ = gguf.GGML_QUANT_SIZES[qt]
    try:
        gguf.quants.quantize(np.zeros((1, block_size * 32), dtype=np.float32), qt)
        return True
    except NotImplementedError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "tests/data/dequant"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import gguf
    from importlib.metadata import version

    rng = np.random.default_rng(SEED)
    index = {
        "generator": "tools/goldens/dequant_goldens.py",
        "versions": {"python": sys.version.split()[0], "gguf": version("gguf"), "numpy": np.__version__},
        "endianness": "little",
        "types": {},
    }
    for name in TYPES:
        qt = gguf.GGMLQuantizationType[name]
        block_size, type_size = gguf.GGML_QUANT_SIZES[qt]
        low = name.lower()
        raw = random_blocks(qt, rng)
        if name in ("F16", "BF16"):
            deq = gguf.quants.dequantize(raw.reshape(1, -1), qt).reshape(-1)
        else:
            deq = gguf.quants.dequantize(raw, qt).reshape(-1)
        deq = np.ascontiguousarray(deq, dtype="<f4")
        assert np.all(np.isfinite(deq)), name
        (out / f"{low}.bin").write_bytes(raw.tobytes())
        (out / f"{low}.f32").write_bytes(deq.tobytes())
        n_blocks = raw.size // type_size
        entry = {
            "ggml_type": int(qt), "block_size": block_size, "type_size": type_size,
            "dequant": {"blocks": f"{low}.bin", "expected_f32": f"{low}.f32", "n_blocks": int(n_blocks),
                        "n_values": int(deq.size), "made_by": "gguf.quants.dequantize"},
        }
        if can_quantize(qt):
            x = quant_inputs(name, rng)
            if name == "F16":
                with np.errstate(over="ignore"):  # 65520 -> +inf is part of the golden
                    q = gguf.quants.quantize(x, qt)  # numpy float32 -> float16, round-to-nearest-even
            else:
                q = gguf.quants.quantize(x.reshape(1, -1), qt)
            qb = np.ascontiguousarray(q).view(np.uint8).reshape(-1)
            assert qb.size == x.size // block_size * type_size
            (out / f"{low}.quant_in.f32").write_bytes(np.ascontiguousarray(x, dtype="<f4").tobytes())
            (out / f"{low}.quant_out.bin").write_bytes(qb.tobytes())
            entry["quantize"] = {"input_f32": f"{low}.quant_in.f32", "expected_blocks": f"{low}.quant_out.bin",
                                 "n_values": int(x.size), "n_blocks": int(x.size // block_size),
                                 "made_by": "gguf.quants.quantize"}
        else:
            entry["quantize"] = None  # gguf-py cannot quantize this type
        index["types"][low] = entry
        print(f"{low:5s} dequant {n_blocks} blocks ({deq.size} values) "
              f"quantize {'yes' if entry['quantize'] else 'no (not in gguf-py)'}")
    (out / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
