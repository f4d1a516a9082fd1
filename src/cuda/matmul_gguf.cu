// y = x W^T for a GGUF-typed weight used in place: the bandwidth-bound
// product of decode and small prefill steps.
//
// Blocking. One warp owns one output column j (weight row j) and one group
// of up to kRowGroup activation rows; a block is kWarps warps on kWarps
// consecutive columns of the same row group; the grid is (column tiles,
// row groups). The warp streams its weight row through shared memory in
// stages of kStageUnits units (gguf_unit_impl.h): each stage is one
// contiguous byte range copied with coalesced 16-byte loads (2-byte loads
// when the row is not 16-byte aligned), so any block layout (18-, 34-,
// 210-byte blocks) is read at full width. Lane l then decodes units
// l, l + 32, ... of the stage and accumulates them into one float per row.
//
// Reduction order (the determinism contract). For every (row, column):
// lane l accumulates, with FMA, the elements of units l, l + 32, l + 64, ...
// in increasing order (inside a unit, its elements in order); the 32 lane
// sums are added by the fixed butterfly xor 16, 8, 4, 2, 1. That depends
// only on n_in and the type: not on n_rows, the row's place in its group
// (each row has its own accumulator and the same instructions), nor the grid.
//
// Bandwidth. With n_rows <= 8 every weight byte is read once from HBM;
// each block stages the rows of x it uses in shared memory, stage by stage;
// larger n_rows re-stream the weights once per group of 8 rows (from L2 when
// they fit) - large prefill GEMMs belong to cuBLAS on dequantized weights.
// Activations are re-read per column from L1/L2 (float4 loads).
#include <algorithm>

#include "cuda/gguf_unit_impl.cuh"

namespace ferry::cuda {
namespace {

using namespace detail;

constexpr int kWarps = 4;     // columns per block
constexpr int kRowGroup = 8;  // activation rows sharing one pass over the weights

// Units per lane per stage: about 4 KB of weight bytes per warp per stage
// (2.1-4.3 KB across the types) so that one stage keeps enough loads in
// flight while 32+ warps fit per SM.
template <DType T>
constexpr int units_per_lane() {
  if constexpr (T == DType::F32)
    return 2;
  else
    return 4;
}

// Steps of up to kFewRows rows (decode) stage kFewRows rows of x per block
// with the type's units per lane; larger ones stage kRowGroup rows with one
// unit per lane per stage, so that the staged x fits (below).
constexpr int kFewRows = 2;

template <DType T, bool kVec16, int kXRows, int kUpl>
__global__ void __launch_bounds__(kWarps * 32)
    matmul_gguf_kernel(const uint8_t* w, size_t row_bytes, uint32_t n_units, const float* x,
                       size_t n_in, uint32_t n_out, uint32_t n_rows, float* y) {
  using U = Gguf<T>;
  // A stage is kUpl units per lane; lane l takes units l, l + 32, ... of
  // each stage in order, which over the whole row is units l, l + 32, l +
  // 64, ... whatever kUpl: the reduction order does not depend on it.
  constexpr uint32_t kStageUnits = 32 * kUpl;
  constexpr uint32_t kUnitBytesNum =
      U::kElems * U::kBlockBytes;  // bytes of one unit = this / kBlockElems
  constexpr uint32_t kStageBytes = kStageUnits * kUnitBytesNum / U::kBlockElems;
  static_assert(kStageUnits * U::kElems % U::kBlockElems == 0, "a stage is whole blocks");
  __shared__ __align__(16) uint8_t stage_all[kWarps][kStageBytes];
  // The stage's activations (up to kXRows rows) are staged once per block,
  // unit u's elements at u * (kElems + 1), so the lanes' reads (unit l + 32k
  // each) fall in distinct banks instead of 32 scattered L1 lines per load.
  constexpr uint32_t kPitch = U::kElems + 1;
  __shared__ float xs[kXRows * kStageUnits * kPitch];

  detail::dependency_wait();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t j = blockIdx.x * kWarps + warp;
  const bool active = j < n_out;  // idle warps stay: the block syncs per stage
  const uint32_t r0 = blockIdx.y * kRowGroup;
  const int nr = static_cast<int>(min(static_cast<uint32_t>(kRowGroup), n_rows - r0));
  uint8_t* stage = stage_all[warp];
  const uint8_t* wrow = w + size_t{active ? j : 0} * row_bytes;
  const float* xg = x + size_t{r0} * n_in;

  float acc[kRowGroup];
#pragma unroll
  for (int r = 0; r < kRowGroup; ++r) acc[r] = 0.0f;

  for (uint32_t s0 = 0; s0 < n_units; s0 += kStageUnits) {
    const uint32_t units = min(kStageUnits, n_units - s0);
    // n_units is a whole number of blocks, so every stage is whole blocks.
    const uint32_t bytes = units * kUnitBytesNum / U::kBlockElems;
    const uint8_t* src = wrow + size_t{s0} * kUnitBytesNum / U::kBlockElems;
    __syncthreads();  // the previous stage's reads of xs and stage are done
    {
      const uint32_t n = units * U::kElems;
      for (int r = 0; r < nr; ++r)
        for (uint32_t i = threadIdx.x; i < n; i += kWarps * 32)
          xs[(r * kStageUnits + i / U::kElems) * kPitch + i % U::kElems] =
              xg[static_cast<size_t>(r) * n_in + size_t{s0} * U::kElems + i];
    }
    if constexpr (kVec16) {
      for (uint32_t i = lane; i < bytes / 16; i += 32)
        reinterpret_cast<uint4*>(stage)[i] = __ldg(reinterpret_cast<const uint4*>(src) + i);
    } else {
      for (uint32_t i = lane; i < bytes / 2; i += 32)
        reinterpret_cast<uint16_t*>(stage)[i] =
            __ldg(reinterpret_cast<const unsigned short*>(src) + i);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kUpl; ++k) {
      const uint32_t u = 32 * k + lane;
      if (u >= units) break;
      float wv[U::kElems];
      U::decode(stage, u, wv);
#pragma unroll
      for (int r = 0; r < kXRows; ++r) {
        if (r >= nr) break;
        const float* xr = xs + (r * kStageUnits + u) * kPitch;
#pragma unroll
        for (int e = 0; e < U::kElems; ++e) acc[r] = __fmaf_rn(wv[e], xr[e], acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowGroup; ++r) {
    const float v = warp_sum(acc[r]);  // all lanes take part, even for r >= nr
    if (active && lane == 0 && r < nr) y[size_t{r0 + r} * n_out + j] = v;
  }
}

}  // namespace

void matmul_gguf(const uint8_t* w, DType type, size_t n_in, size_t n_out, const float* x,
                 size_t n_rows, float* y, cudaStream_t stream) {
  if (n_rows == 0 || n_out == 0) return;
  detail::check_gguf_rows("matmul_gguf", w, type, n_in);
  FERRY_CHECK(n_out <= 0xffffffffu - kWarps, "matmul_gguf", "n_out=", n_out);
  const size_t row_groups = (n_rows + kRowGroup - 1) / kRowGroup;
  FERRY_CHECK(row_groups <= 65535, "matmul_gguf", "n_rows=", n_rows, " too large");
  FERRY_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0, "matmul_gguf", "x not 16-byte aligned");
  const size_t rb = row_bytes(type, n_in);
  const dim3 grid(static_cast<unsigned>((n_out + kWarps - 1) / kWarps),
                  static_cast<unsigned>(row_groups));
  detail::dispatch_dtype(type, "matmul_gguf", [&](auto tag) {
    constexpr DType T = decltype(tag)::value;
    const uint32_t n_units = static_cast<uint32_t>(n_in / detail::Gguf<T>::kElems);
    const uint32_t no = static_cast<uint32_t>(n_out), nr = static_cast<uint32_t>(n_rows);
    constexpr int kUpl = units_per_lane<T>();
    // 16-byte loads need 16-byte rows and stages (Q6_K's 32-unit stage is
    // 840 bytes: 2-byte loads there).
    constexpr auto stage_bytes = [](int upl) {
      using U = detail::Gguf<T>;
      return 32u * upl * U::kElems * U::kBlockBytes / U::kBlockElems;
    };
    const bool vec = rb % 16 == 0;
    auto go = [&](auto kernel) {
      detail::launch("matmul_gguf_kernel", kernel, grid, kWarps * 32, 0, stream, w, rb, n_units, x,
                     n_in, no, nr, y);
    };
    if (n_rows <= kFewRows) {
      if (vec && stage_bytes(kUpl) % 16 == 0)
        go(matmul_gguf_kernel<T, true, kFewRows, kUpl>);
      else
        go(matmul_gguf_kernel<T, false, kFewRows, kUpl>);
    } else if (vec && stage_bytes(1) % 16 == 0) {
      go(matmul_gguf_kernel<T, true, kRowGroup, 1>);
    } else {
      go(matmul_gguf_kernel<T, false, kRowGroup, 1>);
    }
  });
}

}  // namespace ferry::cuda
