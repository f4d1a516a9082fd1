// FP8 (E4M3) quantization and rescaling kernels for --fp8 (fp8.h).
#include <cuda_fp8.h>

#include <algorithm>

#include "core/error.h"
#include "cuda/common_impl.cuh"
#include "cuda/fp8.h"
#include "cuda/fp8_impl.cuh"
#include "cuda/knobs.h"
#include "cuda/matmul_tc.cuh"
#include "cuda/ptx_impl.cuh"

namespace ferry::cuda {
namespace {

using detail::dependency_wait;
using detail::launch;
using detail::to_e4m3;

constexpr int kQuantThreads = 1024;
// Rows of F32 values up to this long (a multiple of 4, 16-byte aligned)
// stay in registers: one memory round trip a row (decode steps quantize
// one row per product, so the row's latency is the kernel's).
constexpr int kRegVecs = 4;
constexpr uint32_t kRegRow = kQuantThreads * kRegVecs * 4;

template <DType T>
__device__ __forceinline__ float load_value(const void* p, size_t i) {
  if constexpr (T == DType::F32)
    return static_cast<const float*>(p)[i];
  else if constexpr (T == DType::BF16)
    return detail::bf2f(static_cast<const uint16_t*>(p)[i]);
  else
    return detail::h2f(static_cast<const uint16_t*>(p)[i]);
}

// One block per row: the row's largest magnitude, then each value times
// 448 / max rounded to E4M3. kVec: F32 rows of at most kRegRow values, a
// multiple of 4, read once into registers as float4s.
template <DType T, bool kVec>
__global__ void __launch_bounds__(kQuantThreads)
    quantize_fp8_kernel(const void* __restrict__ x, uint32_t n, uint8_t* __restrict__ codes,
                        float* __restrict__ scales) {
  dependency_wait();
  const size_t row = size_t{blockIdx.x} * n;
  float a = 0.0f;
  float4 v[kRegVecs];
  if constexpr (kVec) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(x) + row);
#pragma unroll
    for (int i = 0; i < kRegVecs; ++i) {
      const uint32_t at = threadIdx.x + i * kQuantThreads;
      v[i] = at < n / 4 ? p[at] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      a = fmaxf(a, fmaxf(fmaxf(fabsf(v[i].x), fabsf(v[i].y)), fmaxf(fabsf(v[i].z), fabsf(v[i].w))));
    }
  } else {
    for (uint32_t i = threadIdx.x; i < n; i += kQuantThreads)
      a = fmaxf(a, fabsf(load_value<T>(x, row + i)));
  }
  float inv;
  const float scale = detail::fp8_row_scale(detail::block_max<kQuantThreads>(a), &inv);
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
  if constexpr (kVec) {
    uint32_t* out = reinterpret_cast<uint32_t*>(codes + row);
#pragma unroll
    for (int i = 0; i < kRegVecs; ++i) {
      const uint32_t at = threadIdx.x + i * kQuantThreads;
      if (at < n / 4)
        out[at] = uint32_t{to_e4m3(v[i].x, inv)} | uint32_t{to_e4m3(v[i].y, inv)} << 8 |
                  uint32_t{to_e4m3(v[i].z, inv)} << 16 | uint32_t{to_e4m3(v[i].w, inv)} << 24;
    }
  } else {
    for (uint32_t i = threadIdx.x; i < n; i += kQuantThreads)
      codes[row + i] = to_e4m3(load_value<T>(x, row + i), inv);
  }
}

// A product's sum of codes times its row's and column's scales, in the one
// order every FP8 product path uses (so they agree where their sums do).
__device__ __forceinline__ float fp8_scaled(float sum, float row_scale, float col_scale) {
  return __fmul_rn(sum, __fmul_rn(row_scale, col_scale));
}

template <bool kBf16>
__global__ void scale_fp8_kernel(const void* __restrict__ acc, const float* __restrict__ rs,
                                 const float* __restrict__ cs, uint32_t n_out, size_t total,
                                 float* __restrict__ y) {
  dependency_wait();
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const float v = kBf16 ? detail::bf2f(static_cast<const uint16_t*>(acc)[i])
                          : static_cast<const float*>(acc)[i];
    y[i] = fp8_scaled(v, rs[i / n_out], cs[i % n_out]);
  }
}

// Decode steps (1-8 rows): y = (x W^T) * scale per column, with W's E4M3
// codes and x's bf16 values multiplied in f32 (no activation rounding to
// FP8). A block of kGemvWarps warps takes C columns for all R rows; warp w
// walks 512-value stretches w, w + kGemvWarps, ... of k (a lane 16 values:
// one 16-byte load of codes per column), and the warps' partial sums meet
// in shared memory. Many small blocks keep every SM's loads in flight even
// for the narrow products (K and V: 1,024 columns).
constexpr int kGemvWarps = 8;

__device__ __forceinline__ void e4m3x16_to_f32(const uint4& v, float (&f)[16]) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(u[i] >> (16 * h)), __NV_E4M3);
      const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&r));
      f[4 * i + 2 * h] = p.x;
      f[4 * i + 2 * h + 1] = p.y;
    }
  }
}

template <int R, int C>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_fp8_kernel(const uint8_t* __restrict__ w, const float* __restrict__ sw,
                    const uint16_t* __restrict__ x, uint32_t n_in, uint32_t n_out,
                    float* __restrict__ y) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint32_t j0 = blockIdx.x * C;
  const uint8_t* wr[C];
#pragma unroll
  for (int c = 0; c < C; ++c) wr[c] = w + static_cast<size_t>(min(j0 + c, n_out - 1)) * n_in;
  float acc[C][R] = {};
  uint32_t k = (warp * 32 + lane) * 16;
  constexpr uint32_t kStep = kGemvWarps * 512;
  // The first stretch of codes is a weight: loaded before the wait.
  uint4 wv[C];
  if (k < n_in)
#pragma unroll
    for (int c = 0; c < C; ++c) wv[c] = __ldcs(reinterpret_cast<const uint4*>(wr[c] + k));
  dependency_wait();
  for (; k < n_in; k += kStep) {
    float wf[C][16];
#pragma unroll
    for (int c = 0; c < C; ++c) e4m3x16_to_f32(wv[c], wf[c]);
    if (k + kStep < n_in)
#pragma unroll
      for (int c = 0; c < C; ++c) wv[c] = __ldcs(reinterpret_cast<const uint4*>(wr[c] + k + kStep));
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint4* xp = reinterpret_cast<const uint4*>(x + static_cast<size_t>(r) * n_in + k);
      const uint4 a = xp[0], b = xp[1];
      const uint32_t u[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float x0 = __uint_as_float(u[i] << 16), x1 = __uint_as_float(u[i] & 0xffff0000u);
#pragma unroll
        for (int c = 0; c < C; ++c) {
          acc[c][r] = fmaf(wf[c][2 * i], x0, acc[c][r]);
          acc[c][r] = fmaf(wf[c][2 * i + 1], x1, acc[c][r]);
        }
      }
    }
  }
  __shared__ float part[kGemvWarps][C * R];
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v = acc[c][r];
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) part[warp][c * R + r] = v;
    }
  __syncthreads();
  if (threadIdx.x < C * R) {
    const int c = threadIdx.x / R, r = threadIdx.x % R;
    float v = 0.0f;
#pragma unroll
    for (int i = 0; i < kGemvWarps; ++i) v += part[i][threadIdx.x];
    if (j0 + c < n_out) y[static_cast<size_t>(r) * n_out + j0 + c] = v * sw[j0 + c];
  }
}

template <int R>
void gemv_rows(const uint8_t* w, const float* sw, const uint16_t* x, uint32_t n_in, uint32_t n_out,
               float* y, cudaStream_t stream) {
  constexpr int C = R <= 2 ? 2 : 4;
  const unsigned blocks = (n_out + C - 1) / C;
  launch("gemv_fp8", gemv_fp8_kernel<R, C>, blocks, kGemvWarps * 32, 0, stream, w, sw, x, n_in,
         n_out, y);
}

// Steps of a few dozen rows (matmul_fp8): both operands E4M3 on Hopper's
// FP8 warpgroup mma (wgmma m64nBNk32), fed by TMA as matmul_tc's wgmma
// tiles are. A CTA owns 64 output columns x BN rows over one range of k
// (split-K: blockIdx.y, so that narrow products still give every
// multiprocessor CTAs); one producer warp copies each stage (128 codes of
// k: a 128-byte swizzled row per weight and per activation row) with two
// TMA boxes, and the consumer warpgroup runs the stage's four k32 steps as
// one chain started from zero, then adds the chain's sums to its f32
// accumulators (Hopper's FP8 tensor cores add inside a chain at reduced
// precision; 128 products a chain keep that error near f32's). Out-of-range
// rows, columns and k are zero-filled by the copies and never stored.
// One split: y = sum * (x_scale * w_scale), as scale_fp8_product forms it;
// several: each writes its sum to part[split] and fp8_split_sum adds the
// splits in order, so every output has one fixed order of additions for
// its shape.
constexpr uint32_t kWgCols = 64, kWgK = 128;

template <int BN>
struct Fp8WgTile {
  static constexpr int kStages = BN <= 32 ? 8 : 6;
  static constexpr int kThreads = 128 + 32;  // the consumer warpgroup + the producer warp
  static constexpr uint32_t kWBytes = kWgCols * kWgK;
  static constexpr uint32_t kStageBytes = (kWgCols + BN) * kWgK;
  // + alignment, + the stages' full and empty barriers
  static constexpr size_t kSmemBytes = size_t{kStages} * kStageBytes + 1024 + 16 * kStages;
};
struct Fp8Maps {
  CUtensorMap w, x;  // boxes of 128 codes x 64 weight rows / BN activation rows
};

template <int BN>
__global__ void __launch_bounds__(Fp8WgTile<BN>::kThreads)
    matmul_fp8_kernel(const __grid_constant__ Fp8Maps maps, const float* __restrict__ ws,
                      const float* __restrict__ xs, uint32_t n_in, uint32_t n_out, uint32_t n_rows,
                      uint32_t split_tiles, uint32_t pre_stages, float* __restrict__ part,
                      float* __restrict__ y) {
#if FERRY_SM90A
  using T = Fp8WgTile<BN>;
  constexpr int S = T::kStages;
  extern __shared__ uint4 smem_raw[];
  const uint32_t smem =
      (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
  const uint32_t full = smem + S * T::kStageBytes, empty = full + 8 * S;
  const uint32_t j0 = blockIdx.x * kWgCols, r0 = blockIdx.z * BN;
  const uint32_t k_tiles = (n_in + kWgK - 1) / kWgK, kt0 = blockIdx.y * split_tiles;
  const uint32_t nt = min(split_tiles, k_tiles - kt0);  // this CTA's stages

  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      detail::mbar_init(full + 8 * s, 1);
      detail::mbar_init(empty + 8 * s, 1);
    }
    detail::mbar_init_fence();
  }
  __syncthreads();

  if (threadIdx.x >= 128) {  // the producer warp
    if (threadIdx.x == 128) {
      auto issue_w = [&](uint32_t i) {
        const uint32_t st = smem + (i % S) * T::kStageBytes, bar = full + 8 * (i % S);
        detail::mbar_expect_tx(bar, T::kStageBytes);
        detail::tma_load_2d(st, &maps.w, static_cast<int>((kt0 + i) * kWgK), static_cast<int>(j0),
                            bar);
      };
      auto issue_x = [&](uint32_t i) {
        const uint32_t st = smem + (i % S) * T::kStageBytes, bar = full + 8 * (i % S);
        detail::tma_load_2d(st + T::kWBytes, &maps.x, static_cast<int>((kt0 + i) * kWgK),
                            static_cast<int>(r0), bar);
      };
      // The first stages' weights before the dependency wait (they do not
      // depend on the previous kernel), then their activations.
      const uint32_t ring = min(static_cast<uint32_t>(S), nt), pre = min(ring, pre_stages);
      for (uint32_t i = 0; i < pre; ++i) issue_w(i);
      detail::dependency_wait();
      for (uint32_t i = pre; i < ring; ++i) issue_w(i);
      for (uint32_t i = 0; i < ring; ++i) issue_x(i);
      for (uint32_t i = S; i < nt; ++i) {
        detail::mbar_wait(empty + 8 * (i % S), (i / S - 1) & 1);
        issue_w(i);
        issue_x(i);
      }
    }
    return;
  }
  detail::dependency_wait();  // (y and part may still be read by the kernel before)

  float acc[BN / 2], chain[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = chain[i] = 0.0f;
  for (uint32_t i = 0; i < nt; ++i) {
    const uint32_t slot = i % S, st = smem + slot * T::kStageBytes;
    detail::mbar_wait(full + 8 * slot, (i / S) & 1);
    detail::wgmma_pin(chain);
    detail::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < static_cast<int>(kWgK / 32); ++kk)
      detail::wgmma_e4m3<BN>(chain, detail::wgmma_desc_sw128(st + kk * 32),
                             detail::wgmma_desc_sw128(st + T::kWBytes + kk * 32), kk > 0);
    detail::wgmma_commit();
    detail::wgmma_wait<0>();
    detail::wgmma_pin(chain);
    detail::mbar_arrive_if(empty + 8 * slot, threadIdx.x == 0);
#pragma unroll
    for (int e = 0; e < BN / 2; ++e) acc[e] += chain[e];
  }

  // acc[4i + e]: column j0 + 16 warp + g (+ 8 for e >= 2), row r0 + 8i + 2c + (e & 1).
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int g = lane / 4, c = lane % 4;
  float* out = gridDim.y > 1 ? part + static_cast<size_t>(blockIdx.y) * n_rows * n_out : y;
#pragma unroll
  for (int i = 0; i < BN / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t j = j0 + warp * 16 + g + 8 * (e / 2), r = r0 + i * 8 + 2 * c + e % 2;
      if (j < n_out && r < n_rows)
        out[static_cast<size_t>(r) * n_out + j] =
            gridDim.y > 1 ? acc[i * 4 + e] : fp8_scaled(acc[i * 4 + e], xs[r], ws[j]);
    }
#else
  (void)maps, (void)ws, (void)xs, (void)n_in, (void)n_out, (void)n_rows, (void)split_tiles;
  (void)pre_stages, (void)part, (void)y;
  (void)Fp8WgTile<BN>::kWBytes;  // (the sm_90a image's)
#endif
}

// y = (part[0] + part[1] + ... in order) * (x_scale * w_scale).
__global__ void fp8_split_sum_kernel(const float* __restrict__ part, uint32_t splits,
                                     const float* __restrict__ xs, const float* __restrict__ ws,
                                     uint32_t n_out, size_t total, float* __restrict__ y) {
  dependency_wait();
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    float v = part[i];
    for (uint32_t s = 1; s < splits; ++s) v += part[s * total + i];
    y[i] = fp8_scaled(v, xs[i / n_out], ws[i % n_out]);
  }
}

// How matmul_fp8 cuts a product: row tiles of BN (32 for up to 32 rows,
// else 64), column tiles of 64, and k split into as many ranges as keep
// the CTAs within one wave of two a multiprocessor (two fit on each), with
// at least 4 stages a range. The cut depends on the shape and the GPU only.
struct Fp8Plan {
  uint32_t bn, row_tiles, col_tiles, splits, split_tiles;
};
// The fewest stages a split may have (FERRY_CUDA_FP8_MIN_STAGES, a measuring knob).
uint32_t min_split_stages() {
  static const uint32_t v = static_cast<uint32_t>(
      std::clamp<size_t>(knob_size("FERRY_CUDA_FP8_MIN_STAGES", 4), 1, 1u << 16));
  return v;
}
Fp8Plan fp8_plan(size_t n_in, size_t n_out, size_t n_rows) {
  Fp8Plan p{};
  p.bn = n_rows <= 32 ? 32 : 64;
  p.row_tiles = static_cast<uint32_t>((n_rows + p.bn - 1) / p.bn);
  p.col_tiles = static_cast<uint32_t>((n_out + kWgCols - 1) / kWgCols);
  const uint32_t k_tiles = static_cast<uint32_t>((n_in + kWgK - 1) / kWgK);
  const size_t wave = 2 * tc::device_sms();
  const uint32_t splits = static_cast<uint32_t>(std::max<size_t>(
      std::min<size_t>(wave / (size_t{p.col_tiles} * p.row_tiles), k_tiles / min_split_stages()),
      1));
  p.split_tiles = (k_tiles + splits - 1) / splits;
  p.splits = (k_tiles + p.split_tiles - 1) / p.split_tiles;
  return p;
}

template <int BN>
void launch_fp8_tiles(const Fp8Plan& p, const uint8_t* w, const float* ws, const uint8_t* x,
                      const float* xs, size_t n_in, size_t n_out, size_t n_rows, float* part,
                      float* y, cudaStream_t stream) {
  using T = Fp8WgTile<BN>;
  detail::raise_smem_limit<matmul_fp8_kernel<BN>>(T::kSmemBytes);
  const Fp8Maps maps{tc::tensor_map_sw128(w, 1, n_in, n_out, kWgCols),
                     tc::tensor_map_sw128(x, 1, n_in, n_rows, BN)};
  launch("matmul_fp8", matmul_fp8_kernel<BN>, dim3(p.col_tiles, p.splits, p.row_tiles), T::kThreads,
         T::kSmemBytes, stream, maps, ws, xs, static_cast<uint32_t>(n_in),
         static_cast<uint32_t>(n_out), static_cast<uint32_t>(n_rows), p.split_tiles,
         tc::pre_stages(), part, y);
}

}  // namespace

bool fp8_supported(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
    return false;
  return major * 10 + minor >= 89;
}

void quantize_fp8_rows(const void* x, DType type, size_t n_rows, size_t n, uint8_t* codes,
                       float* scales, cudaStream_t stream) {
  if (n_rows == 0) return;
  FERRY_CHECK(n_rows < (size_t{1} << 31) && n < (size_t{1} << 31), "fp8", "rows of ", n,
              " values x ", n_rows, " too large");
  const unsigned rows = static_cast<unsigned>(n_rows);
  const uint32_t len = static_cast<uint32_t>(n);
  const auto go = [&](auto kernel) {
    launch("quantize_fp8", kernel, rows, kQuantThreads, 0, stream, x, len, codes, scales);
  };
  switch (type) {
    case DType::F32:
      // Rows of 4k floats from 16-byte boundaries (codes then land on 4-byte ones).
      if (n % 4 == 0 && n <= kRegRow && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
          reinterpret_cast<uintptr_t>(codes) % 4 == 0)
        return go(quantize_fp8_kernel<DType::F32, true>);
      return go(quantize_fp8_kernel<DType::F32, false>);
    case DType::BF16:
      return go(quantize_fp8_kernel<DType::BF16, false>);
    case DType::F16:
      return go(quantize_fp8_kernel<DType::F16, false>);
    default:
      fail("fp8", "cannot quantize ", dtype_traits(type).name, " values to FP8");
  }
}

void gemv_fp8(const uint8_t* w, const float* w_scales, const uint16_t* x, size_t n_in, size_t n_out,
              size_t n_rows, float* y, cudaStream_t stream) {
  if (n_rows == 0 || n_out == 0) return;
  FERRY_CHECK(n_rows <= kFp8GemvRows && n_in % 16 == 0 && n_in < (size_t{1} << 31) &&
                  n_out < (size_t{1} << 31),
              "fp8", "gemv_fp8: ", n_rows, " rows of ", n_in, " -> ", n_out);
  // One unrolled kernel per row count.
  using Launch = void (*)(const uint8_t*, const float*, const uint16_t*, uint32_t, uint32_t, float*,
                          cudaStream_t);
  static constexpr Launch kByRows[kFp8GemvRows] = {gemv_rows<1>, gemv_rows<2>, gemv_rows<3>,
                                                   gemv_rows<4>, gemv_rows<5>, gemv_rows<6>,
                                                   gemv_rows<7>, gemv_rows<8>};
  kByRows[n_rows - 1](w, w_scales, x, static_cast<uint32_t>(n_in), static_cast<uint32_t>(n_out), y,
                      stream);
}

bool matmul_fp8_applies(size_t n_in) {
  return n_in > 0 && n_in % 16 == 0 && n_in < (size_t{1} << 31) && tc::wgmma_available();
}

size_t matmul_fp8_scratch(size_t n_in, size_t n_out, size_t n_rows) {
  if (!matmul_fp8_applies(n_in) || n_rows == 0 || n_out == 0) return 0;
  const Fp8Plan p = fp8_plan(n_in, n_out, n_rows);
  return p.splits > 1 ? size_t{p.splits} * n_rows * n_out * sizeof(float) : 0;
}

void matmul_fp8(const uint8_t* w, const float* w_scales, const uint8_t* x, const float* x_scales,
                size_t n_in, size_t n_out, size_t n_rows, float* y, void* scratch,
                cudaStream_t stream) {
  if (n_rows == 0 || n_out == 0) return;
  FERRY_CHECK(matmul_fp8_applies(n_in) && n_out < (size_t{1} << 31) && n_rows <= size_t{65535} * 32,
              "fp8", "matmul_fp8: ", n_rows, " rows of ", n_in, " -> ", n_out);
  const Fp8Plan p = fp8_plan(n_in, n_out, n_rows);
  float* part = static_cast<float*>(scratch);
  FERRY_CHECK(p.splits == 1 || part != nullptr, "fp8", "matmul_fp8 needs scratch here");
  (p.bn == 32 ? launch_fp8_tiles<32> : launch_fp8_tiles<64>)(p, w, w_scales, x, x_scales, n_in,
                                                             n_out, n_rows, part, y, stream);
  if (p.splits > 1) {
    const size_t total = n_rows * n_out;
    launch("fp8_split_sum", fp8_split_sum_kernel, detail::elementwise_blocks(total, 256), 256, 0,
           stream, part, p.splits, x_scales, w_scales, static_cast<uint32_t>(n_out), total, y);
  }
}

void scale_fp8_product(const void* acc, bool acc_bf16, const float* row_scale,
                       const float* col_scale, size_t n_rows, size_t n_out, float* y,
                       cudaStream_t stream) {
  const size_t total = n_rows * n_out;
  if (total == 0) return;
  const unsigned blocks = detail::elementwise_blocks(total, 256);
  const uint32_t cols = static_cast<uint32_t>(n_out);
  if (acc_bf16)
    launch("scale_fp8", scale_fp8_kernel<true>, blocks, 256, 0, stream, acc, row_scale, col_scale,
           cols, total, y);
  else
    launch("scale_fp8", scale_fp8_kernel<false>, blocks, 256, 0, stream, acc, row_scale, col_scale,
           cols, total, y);
}

}  // namespace ferry::cuda
