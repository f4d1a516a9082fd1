// Random inputs for kernel tests: weights of every dtype with finite,
// moderate scales, and activations.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/cpu.h"
#include "core/dtype.h"
#include "core/half.h"
#include "kernels/ops.h"
#include "kernels/path_kernels.h"

namespace ferry::test {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Byte offsets of the f16 scale fields inside one block of each type.
inline std::vector<size_t> f16_fields(DType t) {
  switch (t) {
    case DType::Q8_0:
    case DType::Q4_0:
      return {0};
    case DType::Q4_1:
    case DType::Q4_K:
    case DType::Q5_K:
      return {0, 2};
    case DType::Q6_K:
      return {208};
    default:
      return {};
  }
}

// n_out rows of n_in elements of type t, random but finite when decoded.
inline std::vector<uint8_t> random_weights(DType t, size_t n_in, size_t n_out, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t rb = row_bytes(t, n_in);
  std::vector<uint8_t> w(rb * n_out);
  if (t == DType::F32 || t == DType::F16 || t == DType::BF16) {
    auto f = random_floats(n_in * n_out, seed);
    for (size_t i = 0; i < f.size(); ++i) {
      if (t == DType::F32) {
        std::memcpy(&w[4 * i], &f[i], 4);
      } else {
        uint16_t h = t == DType::F16 ? f32_to_f16(f[i]) : f32_to_bf16(f[i]);
        std::memcpy(&w[2 * i], &h, 2);
      }
    }
    return w;
  }
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  const DTypeTraits tr = dtype_traits(t);
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  for (size_t blk = 0; blk < w.size() / tr.block_bytes; ++blk)
    for (size_t off : f16_fields(t)) {
      uint16_t h = f32_to_f16(scale(rng));
      std::memcpy(&w[blk * tr.block_bytes + off], &h, 2);
    }
  return w;
}

inline const DType kAllTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0, DType::Q4_0,
                                  DType::Q4_1, DType::Q4_K, DType::Q5_K, DType::Q6_K};

// Every CPU path this machine can run.
inline std::vector<CpuPath> available_paths() {
  std::vector<CpuPath> p{CpuPath::Reference};
  const CpuPath best = best_cpu_path();
  if (best >= CpuPath::Avx2) p.push_back(CpuPath::Avx2);
  if (best >= CpuPath::Avx512) p.push_back(CpuPath::Avx512);
  return p;
}

// Every int8 kernel this machine can run (VNNI is a variant of the AVX-512
// path that kernels::matmul picks itself, so it is listed on its own).
struct Int8Kernel {
  const char* name;
  kernels::MatmulInt8Cols cols;
};
inline std::vector<Int8Kernel> int8_kernels() {
  std::vector<Int8Kernel> k{{"reference", kernels::reference_kernels().matmul_int8_cols}};
  const CpuPath best = best_cpu_path();
  if (best >= CpuPath::Avx2) k.push_back({"avx2", kernels::avx2_kernels().matmul_int8_cols});
  if (best >= CpuPath::Avx512) k.push_back({"avx512", kernels::avx512_kernels().matmul_int8_cols});
  if (best >= CpuPath::Avx512 && cpu_features().avx512vnni)
    k.push_back({"avx512vnni", kernels::avx512vnni_matmul_int8_cols()});
  return k;
}

}  // namespace ferry::test
