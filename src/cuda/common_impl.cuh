// Internal to src/cuda: device helpers shared by ferry's kernels. Every
// conversion here is exact or rounds exactly as its host twin in
// core/half.h, so GPU-encoded bytes equal the CPU's bit for bit.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "core/error.h"
#include "cuda/cuda_ops.h"

// After every kernel launch: a bad configuration surfaces here, named.
#define FERRY_CUDA_LAUNCHED(name) ::ferry::cuda::check(cudaGetLastError(), name, __FILE__, __LINE__)

namespace ferry::cuda::detail {

// ---- f16 / bf16 (bit patterns in uint16_t) ----------------------------------

__device__ __forceinline__ float h2f(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ float bf2f(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// Exact ports of core/half.h's f32_to_f16 / f32_to_bf16 (round to nearest
// even; the same NaN and overflow patterns), so stored KV bytes match the
// CPU even for NaN, which __float2half_rn would canonicalise differently.
__device__ __forceinline__ uint16_t f2h(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (absx < 0x38800000u) {
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;
    uint32_t half_m = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_m & 1))) ++half_m;
    return static_cast<uint16_t>(sign | half_m);
  }
  uint32_t r = absx - 0x38000000u;
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}
__device__ __forceinline__ uint16_t f2bf(float f) {
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// SwiGLU's gating of one element, silu(g) * u, as the CPU writes it
// (g / (1 + exp(-g)), then * u; each step rounded): silu_mul and the fused
// product epilogue (matmul_tc_swiglu) both use this.
__device__ __forceinline__ float silu_mul_one(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// ---- loads ------------------------------------------------------------------

__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) {
  return *reinterpret_cast<const uint16_t*>(p);
}
__device__ __forceinline__ uint32_t ld_u32(const uint8_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
__device__ __forceinline__ uint4 ld_u128(const uint8_t* p) {
  return *reinterpret_cast<const uint4*>(p);
}

// B bytes starting at p as little-endian 32-bit words (w[0] holds bytes
// 0..3). p must be aligned to min(B, 16); B is 1, 2, 4, 8 or a multiple of 16.
template <int B>
struct Bytes {
  uint32_t w[(B + 3) / 4];
  // Field k of width `bits` (bits divides 32), as packed little-endian.
  __device__ __forceinline__ uint32_t field(int k, int bits) const {
    const int per_word = 32 / bits;
    return (w[k / per_word] >> ((k % per_word) * bits)) & ((1u << bits) - 1);
  }
};
template <int B>
__device__ __forceinline__ Bytes<B> load_bytes(const uint8_t* p) {
  Bytes<B> r;
  if constexpr (B == 1) {
    r.w[0] = *p;
  } else if constexpr (B == 2) {
    r.w[0] = ld_u16(p);
  } else if constexpr (B == 4) {
    r.w[0] = ld_u32(p);
  } else if constexpr (B == 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    r.w[0] = v.x;
    r.w[1] = v.y;
  } else {
    static_assert(B % 16 == 0, "load_bytes: B must be 1, 2, 4, 8 or a multiple of 16");
#pragma unroll
    for (int i = 0; i < B / 16; ++i) {
      const uint4 v = ld_u128(p + 16 * i);
      r.w[4 * i] = v.x;
      r.w[4 * i + 1] = v.y;
      r.w[4 * i + 2] = v.z;
      r.w[4 * i + 3] = v.w;
    }
  }
  return r;
}

// ---- warp reductions (fixed butterfly: every lane ends with the same bits,
// since IEEE addition and max are commutative) --------------------------------

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Raises Kernel's dynamic shared-memory limit to at least `bytes` and asks
// for the largest shared-memory carveout, once per device and size
// (cudaFuncSetAttribute is needed above 48 KB).
template <auto Kernel>
void raise_smem_limit(size_t bytes) {
  static std::atomic<size_t> done[64];
  int dev = 0;
  FERRY_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= 0 && dev < 64 && done[dev].load(std::memory_order_relaxed) >= bytes) return;
  FERRY_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
  // The whole unified L1 as shared memory: these kernels stage their
  // operands there, and blocks per SM are what they are short of.
  FERRY_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
  if (dev >= 0 && dev < 64) {
    size_t seen = done[dev].load(std::memory_order_relaxed);
    while (seen < bytes && !done[dev].compare_exchange_weak(seen, bytes)) {
    }
  }
}

// ---- launches -----------------------------------------------------------------
//
// Every ferry kernel is launched by launch(), with programmatic dependent
// launch where the device has it (dependent_launch in cuda_ops.h): its
// blocks may be scheduled while the kernel before it in the stream is still
// running, so the launch and the fill of the next kernel overlap the tail of
// the last one. The contract, for every kernel launched this way: before
// dependency_wait() it only reads memory no operation of the stream writes
// (weights) and writes nothing global; everything else comes after. The wait
// returns once every earlier kernel of the stream has finished and its
// writes are visible (completion is transitive: that kernel waited for its
// own predecessors the same way), and then lets the next kernel start its
// blocks. Without the feature (older GPUs, FERRY_CUDA_PDL=0) the wait is a
// no-op and launches are plain stream-ordered launches.
//
// One exception, attention (AttentionFormats): a kernel may read before its
// wait what was written by kernels that had finished before the one just
// ahead of it passed its own wait, since it cannot start before that: a job
// list expanded at an earlier layer, keys written by earlier steps, and,
// when the kernel just ahead is kv_store (which lets the next kernel start
// only after its wait, and never returns before it), the query its
// predecessor wrote, read through L2 (__ldcg). The backend tracks which
// launch came last (CudaBackend::launch_seq_): every launch of a step goes
// through its mark() or a flush of a held op.
__device__ __forceinline__ void dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// launch() with the grid's blocks in clusters of `cluster` along x (Hopper
// and later; 1: no clusters).
template <class... Params, class... Args>
void launch_cluster(const char* name, void (*kernel)(Params...), dim3 grid, unsigned cluster,
                    dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  int dev = 0;
  FERRY_CUDA_CHECK(cudaGetDevice(&dev));
  cudaLaunchAttribute attrs[2]{};
  unsigned n = 0;
  if (dependent_launch(dev)) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n++].val.clusterDim = {cluster, 1, 1};
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  check(cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(std::forward<Args>(args))...), name,
        __FILE__, __LINE__);
}

template <class... Params, class... Args>
void launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
            cudaStream_t stream, Args&&... args) {
  launch_cluster(name, kernel, grid, 1, block, smem, stream, std::forward<Args>(args)...);
}

// Blocks for a grid-stride elementwise launch over n items.
inline unsigned elementwise_blocks(size_t n, unsigned threads) {
  const size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65536 ? (b == 0 ? 1 : b) : 65536);
}

}  // namespace ferry::cuda::detail
