// Helpers for tests/cuda: device buffers, bit comparison and host-side KV
// planes encoded exactly as kv::LayerStore::encode does.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "core/half.h"
#include "cuda/cuda_ops.h"
#include "kernels/kv_format.h"
#include "kernels/ops.h"
#include "kv/affine_quant.h"

namespace ferry::test {

// Every CUDA call in the tests: throws ferry::Error naming the call on failure.
#define CK(expr) FERRY_CUDA_CHECK(expr)

// Skips the test on a machine without a usable GPU.
#define REQUIRE_GPU()                                                                        \
  do {                                                                                       \
    int n_ = 0;                                                                              \
    if (cudaGetDeviceCount(&n_) != cudaSuccess || n_ == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// An owned device array of n T.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    CK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.size()) { upload(v); }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& v) {
    CK(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  // Fills every byte with `byte` (0xff makes floats NaN): outputs a kernel
  // forgets to write cannot pass for results.
  void poison(uint8_t byte = 0xff) {
    CK(cudaMemset(p_, byte, std::max<size_t>(n_, 1) * sizeof(T)));
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Index of the first element whose bits differ, or -1.
inline long first_bit_diff(const std::vector<float>& a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (bits(a[i]) != bits(b[i])) return static_cast<long>(i);
  return -1;
}

// One KV side of one cache row: n_kv_heads heads of col_cap token slots,
// host and device copies of its planes.
struct KvPlanes {
  kernels::KvFormat fmt;
  size_t D = 0, H = 0, C = 0;
  std::vector<size_t> units;
  std::vector<std::vector<uint8_t>> host;
  std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> dev;

  KvPlanes(kernels::KvFormat f, size_t head_dim, size_t n_kv_heads, size_t col_cap, uint8_t fill)
      : fmt(f), D(head_dim), H(n_kv_heads), C(col_cap), units(f.plane_units(head_dim)) {
    for (size_t u : units) {
      host.emplace_back(H * C * u, fill);
      dev.push_back(std::make_unique<DeviceBuffer<uint8_t>>(H * C * u));
    }
  }
  uint8_t* at(size_t p, size_t h, size_t j) { return host[p].data() + (h * C + j) * units[p]; }
  // Encodes D floats into (h, j) of the host planes, as LayerStore::encode.
  void encode(size_t h, size_t j, const float* x) {
    switch (fmt.kind) {
      case kernels::KvFormat::Kind::F32:
        std::memcpy(at(0, h, j), x, D * 4);
        return;
      case kernels::KvFormat::Kind::F16:
      case kernels::KvFormat::Kind::BF16:
        for (size_t i = 0; i < D; ++i) {
          const uint16_t v =
              fmt.kind == kernels::KvFormat::Kind::F16 ? f32_to_f16(x[i]) : f32_to_bf16(x[i]);
          std::memcpy(at(0, h, j) + 2 * i, &v, 2);
        }
        return;
      case kernels::KvFormat::Kind::Affine: {
        std::vector<uint32_t> packed(D * fmt.bits / 32);
        std::vector<uint16_t> sc(D / fmt.group), bi(D / fmt.group);
        kv::affine_quantize(x, D, fmt.bits, fmt.group, packed.data(), sc.data(), bi.data());
        std::memcpy(at(0, h, j), packed.data(), units[0]);
        std::memcpy(at(1, h, j), sc.data(), units[1]);
        std::memcpy(at(2, h, j), bi.data(), units[2]);
        return;
      }
    }
  }
  void upload() {
    for (size_t p = 0; p < host.size(); ++p) dev[p]->upload(host[p]);
  }
  std::vector<uint8_t> download(size_t p) const { return dev[p]->download(); }
  kernels::KvSide side(bool device) const {
    kernels::KvSide s;
    s.format = fmt;
    for (size_t p = 0; p < units.size(); ++p) {
      s.plane[p] = device ? dev[p]->get() : host[p].data();
      s.head_stride[p] = C * units[p];
      s.unit[p] = units[p];
    }
    return s;
  }
};

}  // namespace ferry::test
