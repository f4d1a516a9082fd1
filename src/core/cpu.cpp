#include "core/cpu.h"

#include <cpuid.h>

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace ferry {

namespace {

uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

CpuFeatures detect() {
  CpuFeatures f;
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

}  // namespace ferry
