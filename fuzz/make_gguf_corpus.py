#!/usr/bin/env python3
"""Writes the GGUF seed corpus in fuzz/corpus/gguf/ with the reference `gguf`
Python package (pip install gguf==0.19.0), a writer independent of ferry's.

test_gguf also parses these files and checks the exact values written here
(tests/gguf/gguf_test.cpp, GgufReference.*), so change both together.
Run from anywhere:  python3 fuzz/make_gguf_corpus.py
"""
import os

import gguf
import numpy as np
from gguf import GGUFValueType as VT

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "gguf")


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def all_types(path):
    """Every metadata type, arrays of several types, a nested array and
    F32 / F16 / Q8_0 / Q4_1 tensors (the quantized ones as raw blocks)."""
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_uint32("llama.block_count", 2)
    w.add_uint8("t.u8", 255)
    w.add_int8("t.i8", -128)
    w.add_uint16("t.u16", 65535)
    w.add_int16("t.i16", -32768)
    w.add_uint32("t.u32", 4294967295)
    w.add_int32("t.i32", -2147483648)
    w.add_uint64("t.u64", 2**64 - 1)
    w.add_int64("t.i64", -(2**63))
    w.add_float32("t.f32", -1.5)
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "h\u00e9llo")
    w.add_array("t.strs", ["a", "bb", "ccc"])
    w.add_key_value("t.u16s", [1, 65535], VT.ARRAY, sub_type=VT.UINT16)
    w.add_key_value("t.f32s", [0.25, -2.0], VT.ARRAY, sub_type=VT.FLOAT32)
    w.add_array("t.nested", [[1, 2], [3]])
    # numpy shape (rows, cols) is GGUF shape [cols, rows].
    w.add_tensor("f32", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.add_tensor("f16", np.array([1, 2, 3, 4, 5], dtype=np.float16))
    w.add_tensor("q8_0", np.arange(68, dtype=np.uint8).reshape(2, 34),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("q4_1", np.full((1, 40), 7, dtype=np.uint8),
                 raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    finish(w)


def align64(path):
    """Custom alignment and a 4-d tensor, written as version 2 (the v2 and v3
    layouts are identical, so the version field is patched)."""
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_custom_alignment(64)
    w.add_tensor("a", np.ones((3,), dtype=np.float32))
    w.add_tensor("b", np.arange(16, dtype=np.float32).reshape(2, 2, 2, 2))
    finish(w)
    with open(path, "r+b") as f:
        f.seek(4)
        f.write((2).to_bytes(4, "little"))


def kv_only(path):
    """Metadata only: a small tokenizer, no tensors."""
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_array("tokenizer.ggml.tokens", ["<s>", "</s>", "a", "b"])
    w.add_key_value("tokenizer.ggml.scores", [0.0, 0.0, -1.0, -2.0], VT.ARRAY,
                    sub_type=VT.FLOAT32)
    w.add_key_value("tokenizer.ggml.token_type", [3, 3, 1, 1], VT.ARRAY, sub_type=VT.INT32)
    finish(w)


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    all_types(os.path.join(OUT, "all_types.gguf"))
    align64(os.path.join(OUT, "v2_align64.gguf"))
    kv_only(os.path.join(OUT, "kv_only.gguf"))
