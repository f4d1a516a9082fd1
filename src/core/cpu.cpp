#include "core/cpu.h"

#include <cpuid.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "core/error.h"
#include "core/parse.h"

namespace ferry {

namespace {

uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

CpuVendor vendor() {
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return CpuVendor::Other;
  char id[13] = {};
  std::memcpy(id, &b, 4);
  std::memcpy(id + 4, &d, 4);
  std::memcpy(id + 8, &c, 4);
  const std::string_view v(id, 12);
  if (v == "GenuineIntel") return CpuVendor::Intel;
  if (v == "AuthenticAMD") return CpuVendor::Amd;
  return CpuVendor::Other;
}

CpuFeatures detect() {
  CpuFeatures f;
  f.vendor = vendor();
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  bool osxsave = c & bit_OSXSAVE;
  bool avx = c & bit_AVX;
  f.fma = c & bit_FMA;
  f.f16c = c & bit_F16C;
  if (!osxsave || !avx) return f;
  uint64_t xcr0 = xgetbv0();
  bool ymm_state = (xcr0 & 0x6) == 0x6;
  bool zmm_state = (xcr0 & 0xe6) == 0xe6;
  if (!ymm_state) return f;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = b & bit_AVX2;
    if (zmm_state) {
      f.avx512f = b & bit_AVX512F;
      f.avx512bw = b & bit_AVX512BW;
      f.avx512vl = b & bit_AVX512VL;
      f.avx512dq = b & bit_AVX512DQ;
      f.avx512vnni = c & bit_AVX512VNNI;
    }
  }
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

std::string_view cpu_path_name(CpuPath p) {
  switch (p) {
    case CpuPath::Reference:
      return "reference";
    case CpuPath::Avx2:
      return "avx2";
    case CpuPath::Avx512:
      return "avx512";
  }
  return "?";
}

CpuPath best_cpu_path() {
  const CpuFeatures& f = cpu_features();
  CpuPath best = CpuPath::Reference;
  if (f.avx2 && f.fma && f.f16c) best = CpuPath::Avx2;
  if (best == CpuPath::Avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq)
    best = CpuPath::Avx512;
  if (const char* env = std::getenv("FERRY_CPU_PATH")) {
    std::string want = env;
    CpuPath p;
    if (want == "reference")
      p = CpuPath::Reference;
    else if (want == "avx2")
      p = CpuPath::Avx2;
    else if (want == "avx512")
      p = CpuPath::Avx512;
    else
      fail("cpu", "FERRY_CPU_PATH='", want, "' is not one of reference, avx2, avx512");
    if (static_cast<int>(p) > static_cast<int>(best))
      fail("cpu", "FERRY_CPU_PATH=", want, " but this CPU supports at most ", cpu_path_name(best));
    best = p;
  }
  return best;
}

size_t parse_prefetch_bytes(std::string_view text) {
  constexpr size_t kMax = size_t{1} << 20;
  const std::optional<size_t> v = parse_decimal(text);
  if (!v || *v > kMax)
    fail("cpu", "FERRY_CPU_PREFETCH='", text, "' is not a byte count from 0 to ", kMax);
  return *v;
}

size_t decode_prefetch_bytes() {
  static const size_t bytes = [] {
    if (const char* env = std::getenv("FERRY_CPU_PREFETCH")) return parse_prefetch_bytes(env);
    // Measured with bench/decode_step, 2 threads (docs/KERNELS.md): 3 KiB
    // on the 2-vCPU Xeon of 2026-12-01; 8 KiB on the 2-vCPU AMD EPYC of
    // 2026-12-07, where 3 KiB was no faster than no prefetch at all.
    return cpu_features().vendor == CpuVendor::Amd ? size_t{8192} : size_t{3072};
  }();
  return bytes;
}

}  // namespace ferry
