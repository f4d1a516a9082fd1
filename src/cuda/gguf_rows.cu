// Whole GGUF rows decoded on the device: embed (rows picked by token id, to
// f32) and dequantize_bf16 (every row, to bf16 for the cuBLAS path). Both
// are exact: the decoded floats equal kernels/quant_blocks.h's bit for bit.
#include <cstdint>

#include "cuda/gguf_unit_impl.cuh"

namespace ferry::cuda {
namespace detail {

void check_gguf_rows(const char* op, const uint8_t* w, DType type, size_t n_in) {
  const DTypeTraits tr = dtype_traits(type);
  const size_t unit = tr.block_elems == 1 ? 16 : 32;
  FERRY_CHECK(n_in % unit == 0 && n_in % tr.block_elems == 0, op, "n_in=", n_in,
              " is not a whole number of ", unit, "-element units of ", tr.name);
  FERRY_CHECK(reinterpret_cast<uintptr_t>(w) % 16 == 0, op, "weights not 16-byte aligned");
  FERRY_CHECK(n_in / unit <= 0xffffffffu, op, "n_in=", n_in, " too large");
}

}  // namespace detail

namespace {

using namespace detail;

constexpr unsigned kThreads = 128;

// Block r decodes row tokens[r]; threads walk its units.
template <DType T>
__global__ void __launch_bounds__(kThreads)
    embed_kernel(const uint8_t* table, size_t row_bytes, uint32_t n_units, const int32_t* tokens,
                 float* out) {
  using U = Gguf<T>;
  dependency_wait();
  const uint8_t* row = table + static_cast<size_t>(tokens[blockIdx.x]) * row_bytes;
  float* o = out + size_t{blockIdx.x} * n_units * U::kElems;
  for (uint32_t u = threadIdx.x; u < n_units; u += kThreads) {
    float v[U::kElems];
    U::decode(row, u, v);
    float4* dst = reinterpret_cast<float4*>(o + size_t{u} * U::kElems);
#pragma unroll
    for (int i = 0; i < U::kElems / 4; ++i)
      dst[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
  }
}

// One thread per (row, unit).
template <DType T>
__global__ void __launch_bounds__(kThreads)
    dequantize_bf16_kernel(const uint8_t* w, size_t row_bytes, uint32_t n_units, size_t n_out,
                           uint16_t* out) {
  using U = Gguf<T>;
  dependency_wait();
  const size_t total = n_out * n_units;
  for (size_t t = blockIdx.x * size_t{kThreads} + threadIdx.x; t < total;
       t += size_t{gridDim.x} * kThreads) {
    const size_t j = t / n_units;
    const uint32_t u = static_cast<uint32_t>(t % n_units);
    float v[U::kElems];
    U::decode(w + j * row_bytes, u, v);
    uint4* dst = reinterpret_cast<uint4*>(out + t * U::kElems);
#pragma unroll
    for (int i = 0; i < U::kElems / 8; ++i) {
      uint32_t p[4];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        p[k] = f2bf(v[8 * i + 2 * k]) | (static_cast<uint32_t>(f2bf(v[8 * i + 2 * k + 1])) << 16);
      dst[i] = make_uint4(p[0], p[1], p[2], p[3]);
    }
  }
}

}  // namespace

void embed(const uint8_t* table, DType type, size_t n_in, const int32_t* tokens, size_t n_tokens,
           float* out, cudaStream_t stream) {
  if (n_tokens == 0) return;
  check_gguf_rows("embed", table, type, n_in);
  FERRY_CHECK(n_tokens <= 0x7fffffffu, "embed", n_tokens, " tokens");
  dispatch_dtype(type, "embed", [&](auto tag) {
    constexpr DType T = decltype(tag)::value;
    const uint32_t n_units = static_cast<uint32_t>(n_in / Gguf<T>::kElems);
    launch("embed_kernel", embed_kernel<T>, static_cast<unsigned>(n_tokens), kThreads, 0, stream,
           table, row_bytes(type, n_in), n_units, tokens, out);
  });
}

void dequantize_bf16(const uint8_t* w, DType type, size_t n_in, size_t n_out, uint16_t* out,
                     cudaStream_t stream) {
  if (n_out == 0 || n_in == 0) return;
  check_gguf_rows("dequantize_bf16", w, type, n_in);
  dispatch_dtype(type, "dequantize_bf16", [&](auto tag) {
    constexpr DType T = decltype(tag)::value;
    const uint32_t n_units = static_cast<uint32_t>(n_in / Gguf<T>::kElems);
    launch("dequantize_bf16_kernel", dequantize_bf16_kernel<T>,
           elementwise_blocks(n_out * n_units, kThreads), kThreads, 0, stream, w,
           row_bytes(type, n_in), n_units, n_out, out);
  });
}

}  // namespace ferry::cuda
