// Run-time CPU feature detection and the kernel path in use.
#pragma once

#include <cstddef>
#include <string_view>

namespace ferry {

// Kernel paths, from the portable reference up. Every path computes every
// output element with the same arithmetic in the same order (see
// docs/KERNELS.md), so they are interchangeable bit for bit.
enum class CpuPath { Reference, Avx2, Avx512 };

enum class CpuVendor { Other, Intel, Amd };

struct CpuFeatures {
  CpuVendor vendor = CpuVendor::Other;
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  // AVX-512 VNNI (vpdpbusd): used by the int8 matmul mode's AVX-512 path
  // when present; some AVX-512 CPUs lack it, and the path then falls back to
  // vpmaddubsw/vpmaddwd with the same results.
  bool avx512vnni = false;
};

const CpuFeatures& cpu_features();
// The best path this CPU supports; FERRY_CPU_PATH=reference|avx2|avx512
// lowers it (a request above what the CPU has is an error).
CpuPath best_cpu_path();
std::string_view cpu_path_name(CpuPath p);

// How far ahead of the weight bytes it is reading the int8 decode kernel
// (few_rows) asks for later ones into L2, in bytes: chosen by vendor from
// measurements (docs/KERNELS.md), or FERRY_CPU_PREFETCH=<bytes> (0: none,
// at most 1 MiB; anything else is an error) for measuring. A prefetch
// changes no result, only speed.
size_t decode_prefetch_bytes();
// A FERRY_CPU_PREFETCH value as a byte count (whole decimal digits, at most
// 1 MiB); anything else throws ferry::Error naming the variable.
size_t parse_prefetch_bytes(std::string_view text);

}  // namespace ferry
