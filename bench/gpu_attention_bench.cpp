// GPU attention and KV-write timing: cuda::attention over one layer of a
// Llama-3.1-8B-shaped cache (32 query heads, 8 kv heads, head_dim 128) for
// each KV format, context length and number of jobs (decode: one query per
// cache row), every kernel variant; and cuda::kv_store of one step's tokens.
//
// Each figure ("us") is the median over CUDA-event timings of back-to-back
// launches (bench/gpu_bench_util.h); launches rotate through enough copies
// of the cache (>= 256 MB) that L2 cannot hold them, as a model's other
// layers would evict it. GB/s counts the K/V bytes the jobs read, once.
// "alone us": one call on an idle device, its kernels timed from a held
// stream (the host's launch calls not counted). With few jobs most of the
// GPU idles while a few warps run long chains; back-to-back launches then
// overlap one another and hide that latency, which a decode step's chain
// of kernels pays: one q4g64 job of 140 keys took 8.4 us back to back, 20
// under Nsight Compute and 16-19 a layer in a step (docs/BENCHMARKS.md,
// session 28).
//   gpu_attention_bench [KV JOBS CTX]   (one case only, e.g. for a profiler:
//                                        q4g64 1 4096; and the KV write of
//                                        JOBS tokens)
//   gpu_attention_bench prefill         (the prefill cases only)
// Built with -DFERRY_CUDA=ON (tests/CMakeLists.txt); needs a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "cuda/cuda_internal.h"
#include "cuda/cuda_ops.h"
#include "gpu_bench_util.h"
#include "kernels/kv_format.h"

using namespace ferry;
using ferry::bench::random_bf16;
using ferry::bench::time_alone;
using ferry::bench::time_launches;
using kernels::KvFormat;

namespace {

constexpr size_t kHeads = 32, kKvHeads = 8, kD = 128;

// One side's planes for `rows` cache rows of `ctx` slots, one row after
// another (head stride ctx * unit), filled with random bytes.
struct Side {
  KvFormat f;
  size_t unit[3] = {0, 0, 0};
  uint8_t* plane[3] = {nullptr, nullptr, nullptr};
  size_t bytes = 0;
  Side(KvFormat fmt, size_t rows, size_t ctx) : f(fmt) {
    const std::vector<size_t> units = f.plane_units(kD);
    for (size_t p = 0; p < units.size() && p < 3; ++p) unit[p] = units[p];
    for (int p = 0; p < 3; ++p)
      if (unit[p]) {
        const size_t n = rows * kKvHeads * ctx * unit[p];
        // bf16 in [-1, 1] is finite as f16 scales and biases too.
        plane[p] = reinterpret_cast<uint8_t*>(random_bf16((n + 1) / 2));
        bytes += n;
      }
  }
  kernels::KvSide side(size_t row, size_t ctx) const {
    kernels::KvSide s;
    s.format = f;
    for (int p = 0; p < 3; ++p)
      if (unit[p]) {
        s.plane[p] = plane[p] + row * kKvHeads * ctx * unit[p];
        s.head_stride[p] = ctx * unit[p];
        s.unit[p] = unit[p];
      }
    return s;
  }
  void free() {
    for (auto* p : plane)
      if (p) CK(cudaFree(p));
  }
};

const char* variant_name(cuda::AttentionVariant v) {
  switch (v) {
    case cuda::AttentionVariant::Auto:
      return "auto";
    case cuda::AttentionVariant::PerBlock:
      return "block";
    case cuda::AttentionVariant::PerWarp:
      return "warp";
    case cuda::AttentionVariant::Split:
      return "split";
    case cuda::AttentionVariant::Shared:
      return "shared";
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  // One case only when asked (KV format name, jobs, context).
  const std::string only_kv = argc > 3 ? argv[1] : "";
  const size_t only_jobs = argc > 3 ? std::stoul(argv[2]) : 0;
  const size_t only_ctx = argc > 3 ? std::stoul(argv[3]) : 0;
  const bool only_prefill = argc == 2 && std::string(argv[1]) == "prefill";
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  const KvFormat formats[] = {KvFormat::bf16(), KvFormat::affine(8, 64), KvFormat::affine(4, 64)};
  const size_t job_counts[] = {1, 8, 64, 256};
  const size_t contexts[] = {128, 1024, 4096, 16384};
  kernels::AttentionShape shape;
  shape.n_heads = kHeads;
  shape.n_kv_heads = kKvHeads;
  shape.head_dim = kD;
  shape.scale = 0.088f;
  // One case: `rows` cache rows of ctx slots; decode (prompt = 0): a job
  // per row over all ctx keys; prefill (prompt > 0): `prompt` consecutive
  // queries per row, query i over keys [0, i + 1) (a causal prompt chunk).
  auto run_case = [&](const KvFormat& f, size_t rows, size_t ctx, size_t prompt,
                      std::initializer_list<cuda::AttentionVariant> variants) {
    const size_t jobs = prompt ? rows * prompt : rows;
    // Copies of the whole cache, each `rows` rows.
    size_t copy_bytes = 0;
    std::vector<Side> ks, vs;
    do {
      ks.emplace_back(f, rows, ctx);
      vs.emplace_back(f, rows, ctx);
      copy_bytes += ks.back().bytes + vs.back().bytes;
    } while (copy_bytes < (size_t{256} << 20));
    const size_t copies = ks.size();
    float *q = nullptr, *out = nullptr, *ws = nullptr;
    CK(cudaMalloc(&q, jobs * kHeads * kD * 4));
    CK(cudaMemset(q, 0x3c, jobs * kHeads * kD * 4));
    CK(cudaMalloc(&out, jobs * kHeads * kD * 4));
    const size_t ws_floats = std::max<size_t>(1, cuda::attention_workspace_floats(jobs, shape));
    const size_t split_floats = prompt ? 1 : jobs * cuda::attention_workspace_floats(1, shape);
    CK(cudaMalloc(&ws, std::max(ws_floats, split_floats) * 4));
    std::vector<cuda::AttentionJob*> d_jobs(copies);
    double read = 0;  // K/V bytes the jobs read (each key once per job)
    for (size_t c = 0; c < copies; ++c) {
      std::vector<cuda::AttentionJob> host(jobs);
      for (size_t j = 0; j < jobs; ++j) {
        const size_t row = prompt ? j / prompt : j, n = prompt ? j % prompt + 1 : ctx;
        host[j].q = q + j * kHeads * kD;
        host[j].out = out + j * kHeads * kD;
        host[j].k = ks[c].side(row, ctx);
        host[j].v = vs[c].side(row, ctx);
        host[j].seg[0] = {0, n};
        if (c == 0) read += static_cast<double>(ks[c].bytes + vs[c].bytes) / (rows * ctx) * n;
      }
      CK(cudaMalloc(&d_jobs[c], jobs * sizeof(cuda::AttentionJob)));
      CK(cudaMemcpy(d_jobs[c], host.data(), jobs * sizeof(cuda::AttentionJob),
                    cudaMemcpyHostToDevice));
    }
    for (auto v : variants) {
      auto call = [&](size_t i) {
        cuda::attention_variant(d_jobs[i % copies], jobs, shape, {f, f}, v, ws, nullptr);
      };
      const double t = time_launches(call, 9), alone = time_alone(call, 15);
      std::printf("%-6s %5zu %6zu %-6s %9.1f %7.0f %9.1f\n", f.name().c_str(), jobs,
                  prompt ? prompt : ctx, variant_name(v), t * 1e6, read / t / 1e9, alone * 1e6);
    }
    std::fflush(stdout);
    for (size_t c = 0; c < copies; ++c) {
      ks[c].free();
      vs[c].free();
      CK(cudaFree(d_jobs[c]));
    }
    CK(cudaFree(q));
    CK(cudaFree(out));
    CK(cudaFree(ws));
  };
  // kv_store: one step's tokens written into a cache of 4096 slots.
  auto run_store = [&](const KvFormat& f, size_t tokens) {
    Side k(f, 1, 4096), v(f, 1, 4096);
    float *src_k = nullptr, *src_v = nullptr;
    CK(cudaMalloc(&src_k, tokens * kKvHeads * kD * 4));
    CK(cudaMalloc(&src_v, tokens * kKvHeads * kD * 4));
    CK(cudaMemset(src_k, 0x3c, tokens * kKvHeads * kD * 4));
    CK(cudaMemset(src_v, 0x3d, tokens * kKvHeads * kD * 4));
    std::vector<cuda::KvWrite> host(tokens);
    for (size_t t = 0; t < tokens; ++t) {
      host[t].k = k.side(0, 4096);
      host[t].v = v.side(0, 4096);
      host[t].slot = static_cast<uint32_t>(t);
      host[t].token = static_cast<uint32_t>(t);
    }
    cuda::KvWrite* d = nullptr;
    CK(cudaMalloc(&d, tokens * sizeof(cuda::KvWrite)));
    CK(cudaMemcpy(d, host.data(), tokens * sizeof(cuda::KvWrite), cudaMemcpyHostToDevice));
    const double t = time_launches(
        [&](size_t) { cuda::kv_store(d, tokens, kKvHeads, kD, src_k, src_v, nullptr); }, 9);
    std::printf("%-6s %6zu %9.1f\n", f.name().c_str(), tokens, t * 1e6);
    k.free();
    v.free();
    CK(cudaFree(src_k));
    CK(cudaFree(src_v));
    CK(cudaFree(d));
  };
  using V = cuda::AttentionVariant;
  std::printf("\n%-6s %5s %6s %-6s %9s %7s %9s\n", "kv", "jobs", "ctx", "kernel", "us", "GB/s",
              "alone us");
  if (!only_kv.empty()) {  // the case asked for, any context
    for (const KvFormat& f : formats)
      if (f.name() == only_kv) {
        run_case(f, only_jobs, only_ctx, 0, {V::Auto, V::PerBlock, V::PerWarp, V::Split});
        std::printf("\n%-6s %6s %9s\n", "kv", "tokens", "store us");
        run_store(f, only_jobs);  // (a step of that many tokens)
      }
    return 0;
  }
  for (const KvFormat& f : formats)
    for (size_t jobs : job_counts)
      for (size_t ctx : contexts)
        if (!only_prefill && jobs * ctx <= 64 * 4096)
          run_case(f, jobs, ctx, 0, {V::Auto, V::PerBlock, V::PerWarp, V::Split});
  // Prefill steps: 17 and 44 prompts of 128 tokens (the 64- and 256-stream
  // runs' prompt steps); "ctx" is the prompt length, GB/s counts each
  // query's keys.
  std::printf("\nprefill (causal prompts of 128 tokens)\n");
  for (const KvFormat& f : {KvFormat::bf16(), KvFormat::affine(4, 64)})
    for (size_t prompts : {17, 44})
      run_case(f, prompts, 128, 128, {V::PerWarp, V::Shared, V::PerBlock});
  // One prompt of 4,096 tokens in one step.
  std::printf("\nprefill (one causal prompt of 4,096 tokens)\n");
  for (const KvFormat& f : formats) run_case(f, 1, 4096, 4096, {V::PerWarp, V::Shared});
  if (only_prefill) return 0;

  std::printf("\n%-6s %6s %9s\n", "kv", "tokens", "store us");
  for (const KvFormat& f : formats)
    for (size_t tokens : {1, 64, 512}) run_store(f, tokens);
  return 0;
}
