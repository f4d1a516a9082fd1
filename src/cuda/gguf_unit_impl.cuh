// Internal to src/cuda: GGUF weight rows decoded in "units" on the device.
//
// A unit is a run of kElems consecutive elements of one weight row (16 for
// the dense types, 32 for the quantized ones: a Q4_0/Q4_1/Q8_0 block, a
// K-quant sub-block, or one of Q6_K's 32-runs), so every consumer (matmul,
// embed, dequantize) walks a row as units 0, 1, 2, ... Unit u of a row
// starts at element u * kElems; decode(row, u, out) writes its kElems floats.
//
// The values are bit-identical to kernels/quant_blocks.h: the same multiply
// then add/subtract, each rounded (the __f*_rn intrinsics are never
// contracted into an FMA, whatever nvcc's -fmad setting).
//
// Alignment: `row` is the start of a weight row (or of a staged copy of whole
// blocks of it) and is 16-byte aligned for F32/F16/BF16/Q4_K/Q5_K, 4-byte
// aligned for Q4_1 and 2-byte aligned for Q4_0/Q8_0/Q6_K; loads are sized to
// what each layout guarantees from there.
#pragma once

#include <type_traits>

#include "core/error.h"
#include "cuda/common_impl.cuh"

namespace ferry::cuda::detail {

template <DType T>
struct Gguf;

template <>
struct Gguf<DType::F32> {
  static constexpr int kElems = 16, kBlockElems = 1, kBlockBytes = 4;
  __device__ static void decode(const uint8_t* row, uint32_t u, float* out) {
    const auto b = load_bytes<64>(row + size_t{u} * 64);
#pragma unroll
    for (int i = 0; i < 16; ++i) out[i] = __uint_as_float(b.w[i]);
  }
};

template <>
struct Gguf<DType::F16> {
  static constexpr int kElems = 16, kBlockElems = 1, kBlockBytes = 2;
  __device__ static void decode(const uint8_t* row, uint32_t u, float* out) {
    const auto b = load_bytes<32>(row + size_t{u} * 32);
#pragma unroll
    for (int i = 0; i < 16; ++i) out[i] = h2f(static_cast<uint16_t>(b.field(i, 16)));
  }
};

template <>
struct Gguf<DType::BF16> {
  static constexpr int kElems = 16, kBlockElems = 1, kBlockBytes = 2;
  __device__ static void decode(const uint8_t* row, uint32_t u, float* out) {
    const auto b = load_bytes<32>(row + size_t{u} * 32);
#pragma unroll
    for (int i = 0; i < 16; ++i) out[i] = bf2f(static_cast<uint16_t>(b.field(i, 16)));
  }
};

// Q8_0: f16 d; int8 q[32]. x = d * q.
template <>
struct Gguf<DType::Q8_0> {
  static constexpr int kElems = 32, kBlockElems = 32, kBlockBytes = 34;
  __device__ static void decode(const uint8_t* row, uint32_t u, float* out) {
    const uint8_t* b = row + size_t{u} * 34;
    const float d = h2f(static_cast<uint16_t>(ld_u16(b)));
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t w = ld_u16(b + 2 + 2 * i);
      out[2 * i] = __fmul_rn(d, static_cast<float>(static_cast<int8_t>(w & 0xff)));
      out[2 * i + 1] = __fmul_rn(d, static_cast<float>(static_cast<int8_t>(w >> 8)));
    }
  }
};

// Q4_0: f16 d; 16 bytes: element i < 16 is the low nibble of byte i, i + 16
// its high nibble. x = d * (q - 8).
template <>
struct Gguf<DType::Q4_0> {
  static constexpr int kElems = 32, kBlockElems = 32, kBlockBytes = 18;
  __device__ static void decode(const uint8_t* row, uint32_t u, float* out) {
    const uint8_t* b = row + size_t{u} * 18;
    const float d = h2f(static_cast<uint16_t>(ld_u16(b)));
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t w = ld_u16(b + 2 + 2 * i);
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int q = static_cast<int>((w >> (8 * k)) & 0xff);
        out[2 * i + k] = __fmul_rn(d, static_cast<float>((q & 0xf) - 8));
        out[2 * i + k + 16] = __fmul_rn(d, static_cast<float>((q >> 4) - 8));
      }
    }
  }
};

// Q4_1: f16 d, f16 m; 16 bytes as Q4_0. x = d * q + m.
template <>
struct Gguf<DType::Q4_1> {
  static constexpr int kElems = 32, kBlockElems = 32, kBlockBytes = 20;
  __device__ static void decode(const uint8_t* row, uint32_t u, float* out) {
    const uint8_t* b = row + size_t{u} * 20;
    const uint32_t dm = ld_u32(b);
    const float d = h2f(static_cast<uint16_t>(dm & 0xffff)),
                m = h2f(static_cast<uint16_t>(dm >> 16));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t w = ld_u32(b + 4 + 4 * i);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t q = (w >> (8 * k)) & 0xff;
        out[4 * i + k] = __fadd_rn(__fmul_rn(d, static_cast<float>(q & 0xf)), m);
        out[4 * i + k + 16] = __fadd_rn(__fmul_rn(d, static_cast<float>(q >> 4)), m);
      }
    }
  }
};

// The packed 6-bit (scale, min) of sub-block j of Q4_K / Q5_K; `s` holds the
// 12 scale bytes as three little-endian words.
__device__ __forceinline__ void k_scale_min(int j, const uint32_t s[3], uint32_t* sc,
                                            uint32_t* mn) {
  auto byte = [&](int i) { return (s[i / 4] >> (8 * (i % 4))) & 0xffu; };
  if (j < 4) {
    *sc = byte(j) & 63;
    *mn = byte(j + 4) & 63;
  } else {
    *sc = (byte(j + 4) & 0xf) | ((byte(j - 4) >> 6) << 4);
    *mn = (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
  }
}

// Q4_K and Q5_K (kHigh): f16 d, f16 dmin, 12 B scales, [32 B fifth bits],
// nibbles; unit s = sub-block s of 8. Sub-blocks 2g and 2g+1 share 32 bytes
// of nibbles (low, then high). x = (d * sc) * q - (dmin * mn).
template <bool kHigh>
struct GgufK45 {
  static constexpr int kElems = 32, kBlockElems = 256, kBlockBytes = kHigh ? 176 : 144;
  __device__ static void decode(const uint8_t* row, uint32_t u, float* out) {
    const uint8_t* b = row + size_t{u / 8} * kBlockBytes;
    const int s = static_cast<int>(u % 8), g = s / 2, nib = 4 * (s & 1);
    const auto head = load_bytes<16>(b);  // d, dmin, 12 scale bytes
    const float d = h2f(static_cast<uint16_t>(head.w[0] & 0xffff));
    const float dmin = h2f(static_cast<uint16_t>(head.w[0] >> 16));
    uint32_t sc, mn;
    k_scale_min(s, &head.w[1], &sc, &mn);
    const float d0 = __fmul_rn(d, static_cast<float>(sc)),
                m0 = __fmul_rn(dmin, static_cast<float>(mn));
    const auto q = load_bytes<32>(b + (kHigh ? 48 : 16) + 32 * g);
    Bytes<32> qh{};
    if constexpr (kHigh) qh = load_bytes<32>(b + 16);
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      uint32_t v = (q.field(i, 8) >> nib) & 0xf;
      if constexpr (kHigh) v |= ((qh.field(i, 8) >> s) & 1) << 4;
      out[i] = __fsub_rn(__fmul_rn(d0, static_cast<float>(v)), m0);
    }
  }
};
template <>
struct Gguf<DType::Q4_K> : GgufK45<false> {};
template <>
struct Gguf<DType::Q5_K> : GgufK45<true> {};

// Q6_K: 128 B low nibbles (ql), 64 B high bit pairs (qh), 16 int8 scales,
// f16 d. Unit u = 4 * half + m is elements 128 half + 32 m + i (i < 32):
// nibble (m >> 1) of ql[64 half + 32 (m & 1) + i], bits 2m of qh[32 half + i],
// scale sc[8 half + 2m + i / 16]. x = (d * sc) * (q - 32).
template <>
struct Gguf<DType::Q6_K> {
  static constexpr int kElems = 32, kBlockElems = 256, kBlockBytes = 210;
  __device__ static void decode(const uint8_t* row, uint32_t u, float* out) {
    const uint8_t* b = row + size_t{u / 8} * 210;
    const int half = static_cast<int>((u % 8) / 4), m = static_cast<int>(u % 4);
    const uint8_t* ql = b + 64 * half + 32 * (m & 1);
    const uint8_t* qh = b + 128 + 32 * half;
    const float d = h2f(static_cast<uint16_t>(ld_u16(b + 208)));
    const uint32_t sc2 = ld_u16(b + 192 + 8 * half + 2 * m);  // scales for i < 16, i >= 16
    const float ds0 = __fmul_rn(d, static_cast<float>(static_cast<int8_t>(sc2 & 0xff)));
    const float ds1 = __fmul_rn(d, static_cast<float>(static_cast<int8_t>(sc2 >> 8)));
#pragma unroll
    for (int i = 0; i < 32; i += 2) {
      const uint32_t l = ld_u16(ql + i), h = ld_u16(qh + i);
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int lo = static_cast<int>(((l >> (8 * k)) >> (4 * (m >> 1))) & 0xf);
        const int hi = static_cast<int>(((h >> (8 * k)) >> (2 * m)) & 3);
        out[i + k] = __fmul_rn(i + k < 16 ? ds0 : ds1, static_cast<float>((lo | (hi << 4)) - 32));
      }
    }
  }
};

// Calls f(std::integral_constant<DType, T>{}) for the runtime type t.
template <class F>
void dispatch_dtype(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::F32:
      return f(std::integral_constant<DType, DType::F32>{});
    case DType::F16:
      return f(std::integral_constant<DType, DType::F16>{});
    case DType::BF16:
      return f(std::integral_constant<DType, DType::BF16>{});
    case DType::Q8_0:
      return f(std::integral_constant<DType, DType::Q8_0>{});
    case DType::Q4_0:
      return f(std::integral_constant<DType, DType::Q4_0>{});
    case DType::Q4_1:
      return f(std::integral_constant<DType, DType::Q4_1>{});
    case DType::Q4_K:
      return f(std::integral_constant<DType, DType::Q4_K>{});
    case DType::Q5_K:
      return f(std::integral_constant<DType, DType::Q5_K>{});
    case DType::Q6_K:
      return f(std::integral_constant<DType, DType::Q6_K>{});
  }
  ::ferry::fail(op, "unsupported weight type ", static_cast<uint32_t>(t));
}

// Host-side preconditions every GGUF kernel shares: n_in a whole number of
// units and a row base aligned as the decoders above assume.
void check_gguf_rows(const char* op, const uint8_t* w, DType type, size_t n_in);

}  // namespace ferry::cuda::detail
