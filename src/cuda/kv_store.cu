// KV writes: one token's K and V rows encoded into a cache side's planes,
// byte-identical to kv::LayerStore::encode (f16/bf16 round to nearest even
// via exact ports of core/half.h; affine is kv/affine_quant.cpp's MLX
// arithmetic with every float operation IEEE-rounded as on the CPU).
#include "cuda/common_impl.cuh"

namespace ferry::cuda {
namespace {

using namespace detail;
using Kind = kernels::KvFormat::Kind;

constexpr unsigned kThreads = 64;

__device__ __forceinline__ void store_u16(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

// std::max / std::min semantics (the first argument on ties and NaN), which
// the CPU's min/max scan and clamp rely on; fmaxf would differ on -0/+0.
__device__ __forceinline__ float std_max(float a, float b) {
  return a < b ? b : a;
}
__device__ __forceinline__ float std_min(float a, float b) {
  return b < a ? b : a;
}

// One group of `group` values of x quantized as affine_quantize does, by
// one warp. The CPU scans the group in order with std::max / std::min, which
// keeps the first of equal extremes (-0 against +0) and never takes a NaN
// (the scan starts at -inf / +inf): an associative choice, so each lane
// scanning a contiguous run in order and the runs combined lowest lane
// first (shfl_down halving) gives the same bits. Every lane then derives
// scale and bias alike and encodes its own bytes.
__device__ void affine_group(const float* v, int group, int bits, uint8_t* codes,
                             uint8_t* scale_out, uint8_t* bias_out, int lane) {
  const float n_bins = static_cast<float>((1 << bits) - 1);
  float w_min = __int_as_float(0x7f800000), w_max = -w_min;
  const int per_lane = (group + 31) / 32;
  for (int i = lane * per_lane; i < min(group, (lane + 1) * per_lane); ++i) {
    w_max = std_max(w_max, v[i]);
    w_min = std_min(w_min, v[i]);
  }
  for (int s = 1; s < 32; s *= 2) {
    const float hi = __shfl_down_sync(0xffffffffu, w_max, s);
    const float lo = __shfl_down_sync(0xffffffffu, w_min, s);
    if (lane % (2 * s) == 0 && lane + s < 32) {
      w_max = std_max(w_max, hi);
      w_min = std_min(w_min, lo);
    }
  }
  w_max = __shfl_sync(0xffffffffu, w_max, 0);
  w_min = __shfl_sync(0xffffffffu, w_min, 0);
  const bool min_edge = fabsf(w_min) > fabsf(w_max);
  float scale = std_max(__fdiv_rn(__fsub_rn(w_max, w_min), n_bins), 1e-7f);
  if (!min_edge) scale = -scale;
  const float edge = min_edge ? w_min : w_max;
  const float q0 = rintf(__fdiv_rn(edge, scale));
  float bias = 0.0f;
  if (q0 != 0.0f) {
    scale = __fdiv_rn(edge, q0);
    bias = edge;
  }
  if (lane == 0) {
    store_u16(scale_out, f2h(scale));
    store_u16(bias_out, f2h(bias));
  }
  // Codes packed little-endian: 8-bit codes are consecutive bytes; 4-bit
  // codes pair up in a byte, the even element in the low nibble.
  const int per_byte = 8 / bits;
  for (int b = lane; b < group / per_byte; b += 32) {
    uint32_t byte = 0;
    for (int k = 0; k < per_byte; ++k) {
      float q = rintf(__fdiv_rn(__fsub_rn(v[b * per_byte + k], bias), scale));
      q = isnan(q) ? 0.0f : std_min(std_max(q, 0.0f), n_bins);
      byte |= static_cast<uint32_t>(q) << (k * bits);
    }
    codes[b] = static_cast<uint8_t>(byte);
  }
}

// Block (write, kv head, side): side 0 is K, 1 is V.
__global__ void __launch_bounds__(kThreads)
    kv_store_kernel(const KvWrite* writes, uint32_t n_kv_heads, uint32_t D, const float* k,
                    const float* v) {
  dependency_wait();
  const KvWrite& wr = writes[blockIdx.x];
  const uint32_t h = blockIdx.y;
  const kernels::KvSide& side = blockIdx.z == 0 ? wr.k : wr.v;
  const float* src = (blockIdx.z == 0 ? k : v) + (size_t{wr.token} * n_kv_heads + h) * D;
  // Planes are device memory the caller owns; KvSide spells them const for readers.
  uint8_t* p0 = const_cast<uint8_t*>(side.plane[0]) + h * side.head_stride[0] +
                size_t{wr.slot} * side.unit[0];
  const Kind kind = side.format.kind;
  if (kind == Kind::F32) {
    for (uint32_t i = threadIdx.x; i < D; i += kThreads) reinterpret_cast<float*>(p0)[i] = src[i];
  } else if (kind == Kind::F16 || kind == Kind::BF16) {
    for (uint32_t i = threadIdx.x; i < D; i += kThreads)
      store_u16(p0 + 2 * i, kind == Kind::F16 ? f2h(src[i]) : f2bf(src[i]));
  } else {
    const int group = side.format.group, bits = side.format.bits;
    uint8_t* sc = const_cast<uint8_t*>(side.plane[1]) + h * side.head_stride[1] +
                  size_t{wr.slot} * side.unit[1];
    uint8_t* bi = const_cast<uint8_t*>(side.plane[2]) + h * side.head_stride[2] +
                  size_t{wr.slot} * side.unit[2];
    // A warp per group (the block's warps take groups w, w + kThreads / 32, ...).
    for (uint32_t g = threadIdx.x / 32; g < D / group; g += kThreads / 32)
      affine_group(src + g * group, group, bits, p0 + g * group * bits / 8, sc + 2 * g, bi + 2 * g,
                   static_cast<int>(threadIdx.x % 32));
  }
}

// Block (i, r): copy i's runs r, r + gridDim.y, ..., 16 bytes a thread
// where both ends and the width are 16-byte aligned, else a byte a thread.
__global__ void __launch_bounds__(256) kv_copy_kernel(const KvCopy* copies) {
  dependency_wait();
  const KvCopy c = copies[blockIdx.x];
  const bool wide =
      ((reinterpret_cast<uintptr_t>(c.dst) | reinterpret_cast<uintptr_t>(c.src) | c.dpitch |
        c.spitch | c.width) &
       15u) == 0;
  for (uint32_t r = blockIdx.y; r < c.height; r += gridDim.y) {
    uint8_t* d = c.dst + r * c.dpitch;
    const uint8_t* s = c.src + r * c.spitch;
    if (wide) {
      for (uint32_t i = threadIdx.x; i < c.width / 16; i += blockDim.x)
        reinterpret_cast<uint4*>(d)[i] = reinterpret_cast<const uint4*>(s)[i];
    } else {
      for (uint32_t i = threadIdx.x; i < c.width; i += blockDim.x) d[i] = s[i];
    }
  }
}

}  // namespace

void kv_copy(const KvCopy* copies, size_t n, uint32_t max_height, cudaStream_t stream) {
  if (n == 0 || max_height == 0) return;
  FERRY_CHECK(n <= 0x7fffffffu, "kv_copy", n, " copies");
  const dim3 grid(static_cast<unsigned>(n), std::min(max_height, 64u));
  launch("kv_copy_kernel", kv_copy_kernel, grid, 256, 0, stream, copies);
}

void kv_store(const KvWrite* writes, size_t n_writes, size_t n_kv_heads, size_t head_dim,
              const float* k, const float* v, cudaStream_t stream) {
  if (n_writes == 0 || n_kv_heads == 0) return;
  FERRY_CHECK(n_writes <= 0x7fffffffu && n_kv_heads <= 65535 && head_dim % 16 == 0, "kv_store",
              "writes=", n_writes, " kv_heads=", n_kv_heads, " head_dim=", head_dim);
  const dim3 grid(static_cast<unsigned>(n_writes), static_cast<unsigned>(n_kv_heads), 2);
  launch("kv_store_kernel", kv_store_kernel, grid, kThreads, 0, stream, writes,
         static_cast<uint32_t>(n_kv_heads), static_cast<uint32_t>(head_dim), k, v);
}

}  // namespace ferry::cuda
