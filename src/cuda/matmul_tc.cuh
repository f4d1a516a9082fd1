// Internal to src/cuda (plus its tests and benchmark): the tile variants
// behind cuda::matmul_tc, so that tests can bit-compare every variant on the
// same inputs and the benchmark can time each one. Host declarations only
// (includable from .cpp files built by the host compiler).
//
// Every variant computes every output element with the same arithmetic (see
// matmul_tc.cu); they differ only in how the [n_out, n_rows] output is cut
// into CTA tiles and in the shared-memory pipeline depth.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "cuda/cuda_ops.h"

namespace ferry::cuda::tc {

inline constexpr size_t kMaxWeights = 4;  // weights in one matmul_tc_many launch

struct TileConfig {
  const char* name;
  int bm;               // weight rows (output columns j) per CTA; multiple of 16
  int bn;               // activation rows r per CTA; multiple of 8
  int wm, wn;           // warps along bm and bn (warp tile (bm / wm) x (bn / wn))
  int bk;               // k per pipeline stage; multiple of 64
  int stages;           // pipeline stages in flight (cp.async; TMA for the wgmma variants)
  bool sm90a = false;   // needs the sm_90a image (wgmma_available()): a warpgroup mma
                        // tile (bm = 64 x warpgroups (wm)) or a producer-fed tile
                        // (producers > 0)
  int producers = 0;    // producer-fed skinny tile: copying warps (wm consumer warps)
  bool swiglu = false;  // also runs matmul_tc_swiglu (the fused gate / up epilogue)
};

// choose_config takes the wgmma variants (where available) for steps of
// more rows than this.
inline constexpr size_t kWgmmaAboveRows = 32;

// Whether this device runs the sm_90a image (the wgmma variants): a Hopper
// GPU (compute capability 9.0). Elsewhere choose_config never picks them and
// launching one is an error.
bool wgmma_available();

size_t n_configs();
const TileConfig& config(size_t i);

// How the products pick a variant: per range of row counts (the first
// range with n_rows <= max_rows), candidates from the coarsest tile to the
// finest; the first whose tiles give at least min_ctas CTAs wins (K is
// never split, so the output tiles are all the parallelism there is), else
// the finest. `config(i)` gives candidate i's tile.
struct RowRange {
  size_t max_rows;
  std::span<const size_t> candidates;
};
template <class Config>
size_t pick_tile(std::span<const RowRange> ranges, Config&& config, size_t n_out, size_t n_rows,
                 size_t min_ctas) {
  const RowRange* r = &ranges.back();
  for (const RowRange& rr : ranges)
    if (n_rows <= rr.max_rows) {
      r = &rr;
      break;
    }
  for (size_t i : r->candidates) {
    const TileConfig& c = config(i);
    const size_t ctas = ((n_out + c.bm - 1) / c.bm) * ((n_rows + c.bn - 1) / c.bn);
    if (ctas >= min_ctas) return i;
  }
  return r->candidates.back();
}

// The variant matmul_tc uses for this shape (an index into config());
// `wgmma`: whether the Hopper variants may be picked (wgmma_available());
// `sms`: the GPU's multiprocessors (device_sms(); the decode picks keep
// every tile resident at once). Any choice computes the same bits.
size_t choose_config(size_t n_in, size_t n_out, size_t n_rows, bool wgmma, size_t sms);
// The current device's multiprocessor count (cached per device).
size_t device_sms();

// How many pipeline stages of weights a product's producer requests
// before its dependency wait: 2, or FERRY_CUDA_PRE_STAGES (read once). The
// fed and wgmma tiles and matmul_fp8 follow it.
uint32_t pre_stages();

// A row-major matrix of `outer` rows of `inner` elements of elem_bytes
// each (2: bf16; 1: bytes, such as FP8 codes) as a TMA tensor map of boxes
// of 128 bytes of a row x box_rows rows with the 128-byte swizzle (the
// layout wgmma_desc_sw128 describes), out-of-range elements read as zeros.
// The row pitch (inner * elem_bytes) must be a multiple of 16 bytes.
CUtensorMap tensor_map_sw128(const void* base, size_t elem_bytes, size_t inner, size_t outer,
                             uint32_t box_rows);

// matmul_tc / matmul_tc_many with the variant forced (same preconditions,
// same results).
void matmul_tc_with(size_t config, const uint16_t* w, bool w_f16, size_t n_in, size_t n_out,
                    const uint16_t* x, size_t n_rows, float* y, cudaStream_t stream);
// Whether variant `config` can run the fused SwiGLU input (a wgmma variant
// of two warpgroups, or S64x8k256 for decode steps), and matmul_tc_swiglu
// with it forced.
bool swiglu_variant(size_t config);
void matmul_tc_swiglu_with(size_t config, const uint16_t* w_gate, const uint16_t* w_up, size_t n_in,
                           size_t n_out, const uint16_t* x, size_t n_rows, float* gate,
                           uint16_t* gate_bf16, cudaStream_t stream);
void matmul_tc_many_with(size_t config, std::span<const uint16_t* const> w, bool w_f16, size_t n_in,
                         std::span<const size_t> n_out, const uint16_t* x, size_t n_rows,
                         std::span<float* const> y, cudaStream_t stream);
// Whether variant `config` can run the Q/K/V epilogue (a producer-fed
// tile: Hopper, bf16 weights), and matmul_tc_qkv_rope with it forced.
bool rope_variant(size_t config);
void matmul_tc_qkv_rope_with(size_t config, const uint16_t* const (&w)[3], size_t n_in,
                             const size_t (&n_out)[3], const uint16_t* x, size_t n_rows,
                             float* const (&y)[3], const QkvEpilogue& ep, cudaStream_t stream);

}  // namespace ferry::cuda::tc
