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

// One group of kGroup values of x quantized as affine_quantize does, by
// one warp, lane l holding values E l .. E l + E - 1 (E = kGroup / 32) in
// registers. The CPU scans the group in order with std::max / std::min,
// which keeps the first of equal extremes (-0 against +0) and never takes a
// NaN (the scan starts at -inf / +inf): an associative choice, so each lane
// scanning its run in order and the runs then combined pairwise, the lower
// run first, gives the same bits; the butterfly leaves the result in every
// lane. Every lane then derives scale and bias alike and encodes its own
// values. (bits and group are template arguments: the loops unroll and no
// integer division runs.)
template <int kBits, int kGroup>
__device__ void affine_group(const float* v, uint8_t* codes, uint8_t* scale_out, uint8_t* bias_out,
                             int lane) {
  constexpr int E = kGroup / 32;
  constexpr float n_bins = static_cast<float>((1 << kBits) - 1);
  float x[E];
#pragma unroll
  for (int i = 0; i < E; ++i) x[i] = v[E * lane + i];
  float w_min = __int_as_float(0x7f800000), w_max = -w_min;
#pragma unroll
  for (int i = 0; i < E; ++i) {
    w_max = std_max(w_max, x[i]);
    w_min = std_min(w_min, x[i]);
  }
#pragma unroll
  for (int s = 1; s < 32; s *= 2) {
    const float o_max = __shfl_xor_sync(0xffffffffu, w_max, s);
    const float o_min = __shfl_xor_sync(0xffffffffu, w_min, s);
    const bool first = (lane & s) == 0;  // this lane's runs come before the other's
    w_max = first ? std_max(w_max, o_max) : std_max(o_max, w_max);
    w_min = first ? std_min(w_min, o_min) : std_min(o_min, w_min);
  }
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
  uint32_t c[E];
#pragma unroll
  for (int i = 0; i < E; ++i) {
    float q = rintf(__fdiv_rn(__fsub_rn(x[i], bias), scale));
    q = isnan(q) ? 0.0f : std_min(std_max(q, 0.0f), n_bins);
    c[i] = static_cast<uint32_t>(q);
  }
  // Codes packed little-endian: 8-bit codes are consecutive bytes; 4-bit
  // codes pair up in a byte, the even element in the low nibble.
  if constexpr (kBits == 8) {
#pragma unroll
    for (int i = 0; i < E; ++i) codes[E * lane + i] = static_cast<uint8_t>(c[i]);
  } else if constexpr (E == 1) {
    const uint32_t odd = __shfl_down_sync(0xffffffffu, c[0], 1);
    if (lane % 2 == 0) codes[lane / 2] = static_cast<uint8_t>(c[0] | odd << 4);
  } else {
#pragma unroll
    for (int i = 0; i < E; i += 2)
      codes[(E * lane + i) / 2] = static_cast<uint8_t>(c[i] | c[i + 1] << 4);
  }
}

// f.template operator()<bits, group>() for a valid affine format (4 or 8
// bits, groups of 32, 64 or 128: kernels::KvFormat checks).
template <class F>
__device__ __forceinline__ void with_affine(int bits, int group, F&& f) {
  if (bits == 4) {
    if (group == 32) return f.template operator()<4, 32>();
    if (group == 64) return f.template operator()<4, 64>();
    return f.template operator()<4, 128>();
  }
  if (group == 32) return f.template operator()<8, 32>();
  if (group == 64) return f.template operator()<8, 64>();
  f.template operator()<8, 128>();
}

// Block (tokens, kv head, side): side 0 is K, 1 is V; the block writes
// writes w0 .. w0 + per_block - 1 (w0 = blockIdx.x * per_block). Dense
// formats take four elements a thread (one 16-byte load, one 8- or
// 16-byte store where the slot is aligned for it); affine ones a warp per
// (write, group).
__global__ void __launch_bounds__(256)
    kv_store_kernel(const KvWrite* writes, uint32_t n_writes, uint32_t per_block,
                    uint32_t n_kv_heads, uint32_t D, const float* k, const float* v) {
  dependency_wait();
  const uint32_t h = blockIdx.y, w0 = blockIdx.x * per_block;
  const uint32_t n = min(per_block, n_writes - w0);
  // The side's format is the same in every write of a call (one layer's
  // cache), so the branches below agree across the block.
  const Kind kind = (blockIdx.z == 0 ? writes[w0].k : writes[w0].v).format.kind;
  const float* base = blockIdx.z == 0 ? k : v;
  if (kind != Kind::Affine) {
    const uint32_t quads = D / 4;
    for (uint32_t e = threadIdx.x; e < n * quads; e += blockDim.x) {
      const KvWrite& wr = writes[w0 + e / quads];
      const kernels::KvSide& side = blockIdx.z == 0 ? wr.k : wr.v;
      const uint32_t i = (e % quads) * 4;
      const float4 x =
          *reinterpret_cast<const float4*>(base + (size_t{wr.token} * n_kv_heads + h) * D + i);
      // Planes are device memory the caller owns; KvSide spells them const for readers.
      uint8_t* p0 = const_cast<uint8_t*>(side.plane[0]) + h * side.head_stride[0] +
                    size_t{wr.slot} * side.unit[0];
      if (kind == Kind::F32) {
        float* d = reinterpret_cast<float*>(p0) + i;
        if (reinterpret_cast<uintptr_t>(d) % 16 == 0) {
          *reinterpret_cast<float4*>(d) = x;
        } else {
          d[0] = x.x, d[1] = x.y, d[2] = x.z, d[3] = x.w;
        }
      } else {
        const bool f16 = kind == Kind::F16;
        const uint32_t a = f16 ? f2h(x.x) : f2bf(x.x), b = f16 ? f2h(x.y) : f2bf(x.y);
        const uint32_t c = f16 ? f2h(x.z) : f2bf(x.z), d = f16 ? f2h(x.w) : f2bf(x.w);
        uint8_t* dst = p0 + 2 * i;
        if (reinterpret_cast<uintptr_t>(dst) % 8 == 0) {
          *reinterpret_cast<uint2*>(dst) = make_uint2(a | b << 16, c | d << 16);
        } else {
          store_u16(dst, a), store_u16(dst + 2, b), store_u16(dst + 4, c), store_u16(dst + 6, d);
        }
      }
    }
    return;
  }
  const kernels::KvSide& first = blockIdx.z == 0 ? writes[w0].k : writes[w0].v;
  const int group = first.format.group, bits = first.format.bits;
  const uint32_t warp = threadIdx.x / 32, warps = blockDim.x / 32;
  with_affine(bits, group, [&]<int kBits, int kGroup>() {
    const uint32_t groups = D / kGroup;
    for (uint32_t e = warp; e < n * groups; e += warps) {
      const KvWrite& wr = writes[w0 + e / groups];
      const kernels::KvSide& side = blockIdx.z == 0 ? wr.k : wr.v;
      const uint32_t g = e % groups;
      const float* src = base + (size_t{wr.token} * n_kv_heads + h) * D;
      uint8_t* p0 = const_cast<uint8_t*>(side.plane[0]) + h * side.head_stride[0] +
                    size_t{wr.slot} * side.unit[0];
      uint8_t* sc = const_cast<uint8_t*>(side.plane[1]) + h * side.head_stride[1] +
                    size_t{wr.slot} * side.unit[1];
      uint8_t* bi = const_cast<uint8_t*>(side.plane[2]) + h * side.head_stride[2] +
                    size_t{wr.slot} * side.unit[2];
      affine_group<kBits, kGroup>(src + g * kGroup, p0 + g * kGroup * kBits / 8, sc + 2 * g,
                                  bi + 2 * g, static_cast<int>(threadIdx.x % 32));
    }
  });
}

// Block (i, r): copy i's runs r, r + gridDim.y, ..., 16 bytes a thread
// where both ends and the width are 16-byte aligned, else a byte a thread.
__global__ void __launch_bounds__(256) kv_copy_kernel(const KvCopy* copies) {
  dependency_wait();
  const KvCopy c = copies[blockIdx.x];
  const bool wide = ((reinterpret_cast<uintptr_t>(c.dst) | reinterpret_cast<uintptr_t>(c.src) |
                      c.dpitch | c.spitch | c.width) &
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
  FERRY_CHECK(reinterpret_cast<uintptr_t>(k) % 16 == 0 && reinterpret_cast<uintptr_t>(v) % 16 == 0,
              "kv_store", "k and v must be 16-byte aligned");
  // Decode steps: a block of kThreads per (write, head, side), as many
  // blocks as can start at once; prefill steps: 8 writes a block of 256.
  const uint32_t per_block = n_writes >= 64 ? 8 : 1;
  const unsigned threads = per_block == 1 ? kThreads : 256;
  const dim3 grid(static_cast<unsigned>((n_writes + per_block - 1) / per_block),
                  static_cast<unsigned>(n_kv_heads), 2);
  launch("kv_store_kernel", kv_store_kernel, grid, threads, 0, stream, writes,
         static_cast<uint32_t>(n_writes), per_block, static_cast<uint32_t>(n_kv_heads),
         static_cast<uint32_t>(head_dim), k, v);
}

}  // namespace ferry::cuda
