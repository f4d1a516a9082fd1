// GPU matmul throughput: cuda::matmul_tc (deterministic tensor-core product)
// against cuBLAS (cublasGemmEx, bf16 in, f32 compute and out) and, for
// reference, ferry's older deterministic path cuda::matmul_gguf (f32
// activations), on Llama-3.1-8B's projection shapes and the vocab head.
//
// Each figure is the median over `samples` CUDA-event timings of `reps`
// back-to-back launches (reps sized to ~2 ms); launches rotate through
// enough copies of the weights (>= 256 MB in all) that L2 (60 MB) cannot
// hold them. GB/s counts weights + activations + outputs once; TFLOP/s is
// 2 n_rows n_out n_in. The ceilings (a 1 GB device copy, counting read +
// write; cuBLAS on 8192^3 bf16) are measured first, in the same run.
//   gpu_matmul_bench [--sweep[=ROWS,...]]  (--sweep also times every tile
//                                   variant, at ROWS only if given)
//   gpu_matmul_bench --q8 [--sweep] int8 mode instead: cuda::matmul_q8 on
//   Q4_K and Q6_K weights (every variant with --sweep), quantize_q8, and
//   matmul_gguf (exact mode) on the same weights.
//   gpu_matmul_bench --fp8           --fp8's products instead: gemv_fp8 (1-8
//   rows), matmul_fp8 (with its split sum; Hopper), cuBLASLt's FP8
//   product (Fp8Gemm) and quantize_fp8_rows, back to back (and the mma
//   kernels alone: one call on an idle GPU, what a step's chain of kernels
//   pays). Its environment knobs (FERRY_CUDA_FP8_MIN_STAGES,
//   FERRY_CUDA_PRE_STAGES) apply, so one binary times their variants.
// Built with -DFERRY_CUDA=ON (tests/CMakeLists.txt); needs a GPU.
//
// Seen on an H200 (2026-12-02; copy 4235 GB/s, cuBLAS 791 TFLOP/s), matmul_tc
// vs cuBLAS in us: rows 1 (producer-fed tiles, session 19): 4096->4096 10.8
// vs 13.7, 4096->14336 32.0 vs 31.9, 14336->4096 29.3 vs 31.7, 4096->128256
// 238.6 vs 239.9; rows 256: 21.6 vs 19.2,
// 49.5 vs 46.4, 65.1 vs 50.6, 401 vs 416; rows 4096 (TMA-fed wgmma tiles):
// 204 vs 212, 772 vs 741, 686 vs 703, 6892 vs 6420 (620-700 TFLOP/s).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/half.h"
#include "cuda/cuda_ops.h"
#include "cuda/fp8.h"
#include "cuda/matmul_q8.cuh"
#include "cuda/matmul_tc.cuh"
#include "gpu_bench_util.h"

using namespace ferry;
using ferry::bench::random_bf16;
using ferry::bench::time_alone;
using ferry::bench::time_launches;

namespace {

void ck_blas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s failed: %d\n", what, static_cast<int>(st));
    std::exit(1);
  }
}

struct Shape {
  const char* name;
  size_t n_in, n_out;
};
const Shape kShapes[] = {{"qo 4096->4096", 4096, 4096},     {"qkv 4096->6144", 4096, 6144},
                         {"up 4096->14336", 4096, 14336},   {"gateup 4096->28672", 4096, 28672},
                         {"down 14336->4096", 14336, 4096}, {"head 4096->128256", 4096, 128256}};

struct Bufs {
  std::vector<uint16_t*> w;  // rotating copies
  std::vector<uint16_t*> x;
  float* xf = nullptr;  // f32 activations for matmul_gguf
  float* y = nullptr;
};

// Int8 mode: matmul_q8 per weight type, shape and row count (weights of
// random bytes: only the speed is measured). GB/s counts the weight bytes.
void q8_bench(bool sweep, double copy_gbs) {
  const Shape shapes[] = {{"kv 4096->1024", 4096, 1024},
                          {"qo 4096->4096", 4096, 4096},
                          {"up 4096->14336", 4096, 14336},
                          {"down 14336->4096", 14336, 4096},
                          {"head 4096->128256", 4096, 128256}};
  const size_t row_counts[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  const size_t max_rows = 256;
  std::printf("\n%-6s %-18s %4s %-9s %8s %6s %5s %8s %8s%s\n", "type", "shape", "rows", "variant",
              "q8 us", "GB/s", "%HBM", "quant us", "gguf us",
              sweep ? "  | every variant (us)" : "");
  for (DType t : {DType::Q4_K, DType::Q6_K})
    for (const Shape& s : shapes) {
      const size_t wbytes = row_bytes(t, s.n_in) * s.n_out;
      const size_t copies = std::max<size_t>(2, ((size_t{256} << 20) + wbytes - 1) / wbytes);
      std::vector<uint8_t*> w(copies);
      for (auto& p : w) p = reinterpret_cast<uint8_t*>(random_bf16((wbytes + 16 + 1) / 2));
      float *x = nullptr, *y = nullptr, *d = nullptr, *dsum = nullptr;
      int8_t* codes = nullptr;
      CK(cudaMalloc(&x, max_rows * s.n_in * 4));
      CK(cudaMemset(x, 0x3c, max_rows * s.n_in * 4));
      CK(cudaMalloc(&y, max_rows * s.n_out * 4));
      CK(cudaMalloc(&codes, max_rows * s.n_in));
      CK(cudaMalloc(&d, max_rows * s.n_in / 32 * 4));
      CK(cudaMalloc(&dsum, max_rows * s.n_in / 32 * 4));
      cuda::quantize_q8(x, max_rows, s.n_in, codes, d, dsum, nullptr);
      auto q8 = [&](size_t rows, long cfg) {
        return time_launches(
            [&](size_t i) {
              const size_t c = i % copies;
              if (cfg < 0)
                cuda::matmul_q8(w[c], t, s.n_in, s.n_out, codes, d, dsum, rows, y, nullptr);
              else
                cuda::q8::matmul_q8_with(static_cast<size_t>(cfg), w[c], t, s.n_in, s.n_out, codes,
                                         d, dsum, rows, y, nullptr);
            },
            cfg < 0 ? 15 : 5);
      };
      for (size_t rows : row_counts) {
        const double tq = q8(rows, -1);
        const double tz = time_launches(
            [&](size_t) { cuda::quantize_q8(x, rows, s.n_in, codes, d, dsum, nullptr); }, 9);
        double tg = 0;
        if (rows <= 8)
          tg = time_launches(
              [&](size_t i) {
                cuda::matmul_gguf(w[i % copies], t, s.n_in, s.n_out, x, rows, y, nullptr);
              },
              7);
        std::printf("%-6s %-18s %4zu %-9s %8.1f %6.0f %4.0f%% %8.1f %8.1f",
                    std::string(dtype_traits(t).name).c_str(), s.name, rows,
                    cuda::q8::config(cuda::q8::choose_config(s.n_out, rows)).name, tq * 1e6,
                    wbytes / tq / 1e9, 100 * wbytes / tq / 1e9 / copy_gbs, tz * 1e6, tg * 1e6);
        if (sweep) {
          std::printf("  |");
          for (size_t i = 0; i < cuda::q8::n_configs(); ++i) {
            const auto& c = cuda::q8::config(i);
            if ((c.wn == 0) != (rows <= 8) && rows != 8 && rows != 16) continue;  // off-range
            std::printf(" %s %.1f", c.name, q8(rows, static_cast<long>(i)) * 1e6);
          }
        }
        std::printf("\n");
        std::fflush(stdout);
      }
      for (auto* p : w) CK(cudaFree(p));
      for (void* p : {static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(codes),
                      static_cast<void*>(d), static_cast<void*>(dsum)})
        CK(cudaFree(p));
    }
}

// --fp8: the FP8 products per shape and row count (E4M3 codes of random
// bf16 weights, rotated over copies L2 cannot hold). GB/s counts the
// weight codes only (what bounds these products); %HBM is of the device
// copy measured first.
void fp8_bench(double copy_gbs) {
  const Shape shapes[] = {{"kv 4096->1024", 4096, 1024},
                          {"qo 4096->4096", 4096, 4096},
                          {"up 4096->14336", 4096, 14336},
                          {"down 14336->4096", 14336, 4096}};
  const size_t row_counts[] = {1, 2, 3, 4, 5, 6, 8, 9, 16, 32, 34, 48, 64};
  const size_t max_rows = 64;
  const bool mma_ok = cuda::matmul_fp8_applies(4096);
  void* workspace = nullptr;
  const size_t ws_bytes = size_t{32} << 20;
  CK(cudaMalloc(&workspace, ws_bytes));
  cuda::Fp8Gemm gemm(workspace, ws_bytes);
  std::printf("\n%-18s %4s %8s | %8s %8s %6s %5s | %8s %8s | %8s\n", "shape", "rows", "gemv us",
              "mma us", "alone us", "GB/s", "%HBM", "cublasLt", "alone us", "quant us");
  for (const Shape& s : shapes) {
    const size_t wn = s.n_in * s.n_out;
    const size_t copies = std::max<size_t>(2, ((size_t{256} << 20) + wn - 1) / wn);
    uint16_t* wb = random_bf16(wn);
    std::vector<uint8_t*> w(copies);
    float* ws = nullptr;
    CK(cudaMalloc(&ws, s.n_out * 4));
    for (auto& p : w) {
      CK(cudaMalloc(&p, wn));
      cuda::quantize_fp8_rows(wb, DType::BF16, s.n_out, s.n_in, p, ws, nullptr);
    }
    CK(cudaFree(wb));
    uint16_t* xb = random_bf16(max_rows * s.n_in);
    uint8_t* xc = nullptr;
    float *xs = nullptr, *y = nullptr;
    CK(cudaMalloc(&xc, max_rows * s.n_in));
    CK(cudaMalloc(&xs, max_rows * 4));
    CK(cudaMalloc(&y, max_rows * s.n_out * 4));
    cuda::quantize_fp8_rows(xb, DType::BF16, max_rows, s.n_in, xc, xs, nullptr);
    size_t scratch_bytes = 1;
    for (size_t rows : row_counts)
      scratch_bytes = std::max({scratch_bytes, cuda::matmul_fp8_scratch(s.n_in, s.n_out, rows),
                                gemm.scratch_bytes(s.n_out, rows)});
    void* scratch = nullptr;
    CK(cudaMalloc(&scratch, scratch_bytes));
    // (Every kernel loads its first weights before its dependency wait:
    // the weights were written above, long before.)
    CK(cudaDeviceSynchronize());
    for (size_t rows : row_counts) {
      const auto gemv = [&](size_t i) {
        cuda::gemv_fp8(w[i % copies], ws, xb, s.n_in, s.n_out, rows, y, nullptr);
      };
      const auto mma = [&](size_t i) {
        cuda::matmul_fp8(w[i % copies], ws, xc, xs, s.n_in, s.n_out, rows, y, scratch, nullptr);
      };
      const auto lt = [&](size_t i) {
        gemm.product(w[i % copies], ws, xc, xs, s.n_in, s.n_out, rows, y, scratch, nullptr);
      };
      const double tg = rows <= cuda::kFp8GemvRows ? time_launches(gemv, 15) : 0;
      const double t = mma_ok ? time_launches(mma, 15) : 0, ta = mma_ok ? time_alone(mma, 15) : 0;
      const double tl = time_launches(lt, 9), tla = time_alone(lt, 9);
      const double tq = time_launches(
          [&](size_t) { cuda::quantize_fp8_rows(xb, DType::BF16, rows, s.n_in, xc, xs, nullptr); },
          9);
      std::printf("%-18s %4zu %8.1f | %8.1f %8.1f %6.0f %4.0f%% | %8.1f %8.1f | %8.1f\n", s.name,
                  rows, tg * 1e6, t * 1e6, ta * 1e6, t > 0 ? wn / t / 1e9 : 0.0,
                  t > 0 ? 100 * wn / t / 1e9 / copy_gbs : 0.0, tl * 1e6, tla * 1e6, tq * 1e6);
      std::fflush(stdout);
    }
    for (auto* p : w) CK(cudaFree(p));
    for (void* p : {static_cast<void*>(ws), static_cast<void*>(xb), static_cast<void*>(xc),
                    static_cast<void*>(xs), static_cast<void*>(y), scratch})
      CK(cudaFree(p));
  }
  CK(cudaFree(workspace));
}

}  // namespace

int main(int argc, char** argv) {
  bool sweep = false, q8 = false, fp8 = false;
  std::vector<size_t> only_rows;  // --sweep=1,8: sweep these row counts only
  for (int i = 1; i < argc; ++i) {
    sweep = sweep || std::strncmp(argv[i], "--sweep", 7) == 0;
    q8 = q8 || std::strcmp(argv[i], "--q8") == 0;
    fp8 = fp8 || std::strcmp(argv[i], "--fp8") == 0;
    if (std::strncmp(argv[i], "--sweep=", 8) == 0)
      for (const char* p = argv[i] + 8; *p != 0;) {
        char* end = nullptr;
        only_rows.push_back(std::strtoul(p, &end, 10));
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p != 0) break;
      }
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  cublasHandle_t blas;
  ck_blas(cublasCreate(&blas), "cublasCreate");

  // Ceilings.
  double copy_gbs, peak_tflops;
  {
    const size_t n = size_t{1} << 29;  // 1 GB of bf16
    uint16_t *s = random_bf16(n), *d = random_bf16(n);
    const double t = time_launches(
        [&](size_t) { CK(cudaMemcpyAsync(d, s, n * 2, cudaMemcpyDeviceToDevice)); }, 9);
    copy_gbs = 2.0 * n * 2 / t / 1e9;
    CK(cudaFree(s));
    CK(cudaFree(d));
    const int m = 8192;
    uint16_t *A = random_bf16(size_t{m} * m), *B = random_bf16(size_t{m} * m);
    float* C = nullptr;
    CK(cudaMalloc(&C, size_t{m} * m * 4));
    const float one = 1, zero = 0;
    const double tg = time_launches(
        [&](size_t) {
          ck_blas(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, m, m, m, &one, A, CUDA_R_16BF, m, B,
                               CUDA_R_16BF, m, &zero, C, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT),
                  "cublasGemmEx");
        },
        9);
    peak_tflops = 2.0 * m * m * m / tg / 1e12;
    CK(cudaFree(A));
    CK(cudaFree(B));
    CK(cudaFree(C));
    std::printf("ceilings: device copy %.0f GB/s (read + write), cuBLAS bf16 8192^3 %.0f TFLOP/s\n",
                copy_gbs, peak_tflops);
  }

  if (fp8) {
    fp8_bench(copy_gbs);
    cublasDestroy(blas);
    return 0;
  }
  if (q8) {
    q8_bench(sweep, copy_gbs);
    cublasDestroy(blas);
    return 0;
  }
  const bool wgmma = cuda::tc::wgmma_available();
  const size_t row_counts[] = {1, 8, 64, 256, 1024, 4096};
  std::vector<size_t> sweep_rows = {1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256};
  if (!only_rows.empty()) sweep_rows = only_rows;
  size_t max_rows = 4096;
  for (size_t r : sweep_rows) max_rows = std::max(max_rows, r);
  std::vector<std::string> table;
  for (const Shape& s : kShapes) {
    const size_t wn = s.n_in * s.n_out;
    const size_t copies = std::max<size_t>(2, ((size_t{256} << 20) + wn * 2 - 1) / (wn * 2));
    Bufs b;
    for (size_t c = 0; c < copies; ++c) {
      b.w.push_back(random_bf16(wn));
      b.x.push_back(random_bf16(max_rows * s.n_in));
    }
    CK(cudaMalloc(&b.xf, max_rows * s.n_in * 4));
    CK(cudaMemset(b.xf, 0x3c, max_rows * s.n_in * 4));  // 0x3c3c3c3c ~ 0.0115f
    CK(cudaMalloc(&b.y, max_rows * s.n_out * 4));
    auto tc = [&](size_t rows, long cfg) {
      return time_launches(
          [&](size_t i) {
            const size_t c = i % copies;
            if (cfg < 0)
              cuda::matmul_tc(b.w[c], false, s.n_in, s.n_out, b.x[c], rows, b.y, nullptr);
            else
              cuda::tc::matmul_tc_with(static_cast<size_t>(cfg), b.w[c], false, s.n_in, s.n_out,
                                       b.x[c], rows, b.y, nullptr);
          },
          cfg < 0 ? 15 : 7);
    };
    auto bytes = [&](size_t rows) { return 2.0 * wn + 2.0 * rows * s.n_in + 4.0 * rows * s.n_out; };
    auto flops = [&](size_t rows) { return 2.0 * rows * wn; };

    if (sweep) {
      for (size_t rows : sweep_rows) {
        std::printf("sweep %-18s rows=%3zu:", s.name, rows);
        double best = 1e9;
        size_t best_i = 0;
        for (size_t i = 0; i < cuda::tc::n_configs(); ++i) {
          const auto& c = cuda::tc::config(i);
          if ((c.bn <= 32 && rows > 64) || (c.bn >= 64 && rows < 16)) continue;  // off-range
          if (c.sm90a && !wgmma) continue;
          const double t = tc(rows, static_cast<long>(i));
          if (t < best) best = t, best_i = i;
          std::printf(" %s %.1f", c.name, t * 1e6);
        }
        const size_t ch =
            cuda::tc::choose_config(s.n_in, s.n_out, rows, wgmma, cuda::tc::device_sms());
        std::printf(" | best %s %.1fus %.0fGB/s %.0fTF; chosen %s\n", cuda::tc::config(best_i).name,
                    best * 1e6, bytes(rows) / best / 1e9, flops(rows) / best / 1e12,
                    cuda::tc::config(ch).name);
        std::fflush(stdout);
      }
    }

    for (size_t rows : row_counts) {
      const double t_tc = tc(rows, -1);
      const float one = 1, zero = 0;
      const double t_bl = time_launches(
          [&](size_t i) {
            const size_t c = i % copies;
            ck_blas(
                cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s.n_out),
                             static_cast<int>(rows), static_cast<int>(s.n_in), &one, b.w[c],
                             CUDA_R_16BF, static_cast<int>(s.n_in), b.x[c], CUDA_R_16BF,
                             static_cast<int>(s.n_in), &zero, b.y, CUDA_R_32F,
                             static_cast<int>(s.n_out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                "cublasGemmEx");
          },
          15);
      double t_gg = 0;
      if (rows <= 64)
        t_gg = time_launches(
            [&](size_t i) {
              const size_t c = i % copies;
              cuda::matmul_gguf(reinterpret_cast<const uint8_t*>(b.w[c]), DType::BF16, s.n_in,
                                s.n_out, b.xf, rows, b.y, nullptr);
            },
            7);
      char line[400];
      std::snprintf(
          line, sizeof line,
          "%-18s %4zu %-10s %8.1f %6.0f %4.0f%% %6.1f %4.0f%% | %8.1f %6.0f %6.1f | %8.1f", s.name,
          rows,
          cuda::tc::config(
              cuda::tc::choose_config(s.n_in, s.n_out, rows, wgmma, cuda::tc::device_sms()))
              .name,
          t_tc * 1e6, bytes(rows) / t_tc / 1e9, 100 * bytes(rows) / t_tc / 1e9 / copy_gbs,
          flops(rows) / t_tc / 1e12, 100 * flops(rows) / t_tc / 1e12 / peak_tflops, t_bl * 1e6,
          bytes(rows) / t_bl / 1e9, flops(rows) / t_bl / 1e12, t_gg * 1e6);
      table.push_back(line);
    }
    for (size_t c = 0; c < copies; ++c) {
      CK(cudaFree(b.w[c]));
      CK(cudaFree(b.x[c]));
    }
    CK(cudaFree(b.xf));
    CK(cudaFree(b.y));
  }
  std::printf("\n%-18s %4s %-10s %8s %6s %5s %6s %5s | %8s %6s %6s | %8s\n", "shape", "rows",
              "variant", "tc us", "GB/s", "%HBM", "TF/s", "%pk", "cublas", "GB/s", "TF/s",
              "gguf us");
  for (const auto& l : table) std::printf("%s\n", l.c_str());
  cublasDestroy(blas);
  return 0;
}
