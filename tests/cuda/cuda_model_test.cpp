// The CUDA backend against the CPU, model-level (tools/cuda/test.sh runs
// this on a GPU machine; CI has none):
// - logits of every tiny model and SmolLM2 within a stated tolerance of the
//   CPU's, and greedy continuations identical;
// - the KV layer's row operations on device memory leave the same bytes as
//   on the host;
// - the randomized join/leave/rollback schedule (tests/model) bit for bit
//   on the GPU in deterministic mode.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_ops.h"
#include "kv/kv_buffer.h"
#include "model/schedule_harness.h"
#include "model/wide_head_model.h"

namespace ferry::model {
namespace {

std::unique_ptr<Model> gpu_model(const std::string& path, bool deterministic = true,
                                 bool graphs = true,
                                 kernels::MatmulMode matmul = kernels::MatmulMode::Exact,
                                 bool fp8 = false) {
  auto m = load_model(path);
  cuda::CudaOptions o;
  o.deterministic = deterministic;
  o.graphs = graphs;
  o.matmul = matmul;
  o.fp8 = fp8;
  m->set_backend(cuda::make_backend(o));
  return m;
}

// Runs `prompt` then `steps` greedy tokens (chosen by the CPU run, fed to
// both), returning every step's logits.
std::vector<std::vector<float>> trajectory(const Model& m, const kernels::Context& ctx,
                                           const std::vector<int32_t>& prompt,
                                           const std::vector<int32_t>& forced, size_t steps,
                                           std::vector<int32_t>* chosen) {
  kv::BatchKv kv(m.config().kv_spec(kernels::KvFormat::f32(), kernels::KvFormat::f32()),
                 m.kv_allocator());
  const size_t len = prompt.size(), V = m.config().vocab_size;
  kv.prepare_prefill(std::span<const size_t>(&len, 1));
  std::vector<float> logits;
  RowInput in{prompt};
  m.forward(ctx, kv, std::span<const RowInput>(&in, 1), logits);
  kv.finalize_prefill();
  std::vector<std::vector<float>> out;
  for (size_t s = 0; s < steps; ++s) {
    out.emplace_back(logits.begin(), logits.begin() + V);
    const int32_t greedy = static_cast<int32_t>(argmax(logits.data(), V));
    if (chosen) chosen->push_back(greedy);
    const int32_t next = forced.empty() ? greedy : forced[s];
    in = RowInput{std::span<const int32_t>(&next, 1)};
    m.forward(ctx, kv, std::span<const RowInput>(&in, 1), logits);
  }
  return out;
}

// Max |gpu - cpu| over all steps, relative to the largest |cpu| logit.
double max_rel_diff(const std::vector<std::vector<float>>& a,
                    const std::vector<std::vector<float>>& b) {
  double diff = 0, scale = 1e-30;
  for (size_t s = 0; s < a.size(); ++s)
    for (size_t i = 0; i < a[s].size(); ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(a[s][i] - b[s][i])));
      scale = std::max(scale, static_cast<double>(std::fabs(a[s][i])));
    }
  return diff / scale;
}

// The GPU sums in another order than the CPU (warp-strided lanes and
// butterfly trees against 16-lane canonical sums), both in float32; through
// a model's layers such differences stay around 1e-6 of the logits' scale.
// The bound is the one the CPU itself meets against transformers
// (docs/PARITY.md), as a fraction of the largest logit. Models with bf16 or
// f16 weights run their products on tensor cores with activations rounded
// to bf16 (8 significant bits: a relative error of up to 2^-9 per input),
// so their bound is 3e-2, the size of bf16 rounding accumulated over a few
// layers.
constexpr double kTinyTolerance = 1e-4, kBf16Tolerance = 3e-2, kSmolTolerance = 5e-4;
constexpr double kInt8Tolerance = kBf16Tolerance;

// Greedy tokens must agree wherever the CPU's best logit leads the second by
// more than twice the tolerance (closer calls may flip within it).
void expect_greedy_agrees(const std::vector<std::vector<float>>& ref,
                          const std::vector<std::vector<float>>& got, double tol,
                          const std::string& what) {
  double scale = 1e-30;
  for (const auto& v : ref)
    for (float x : v) scale = std::max(scale, static_cast<double>(std::fabs(x)));
  size_t checked = 0;
  for (size_t s = 0; s < ref.size(); ++s) {
    std::vector<float> top(ref[s]);
    std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
    if (top[0] - top[1] <= 2 * tol * scale) continue;
    ++checked;
    EXPECT_EQ(argmax(ref[s].data(), ref[s].size()), argmax(got[s].data(), got[s].size()))
        << what << " step " << s;
  }
  EXPECT_GT(checked, ref.size() / 2) << what << ": too few clear greedy choices to check";
}

class TinyGpuTest : public ::testing::TestWithParam<const char*> {};

TEST_P(TinyGpuTest, LogitsMatchCpuAndGreedyAgrees) {
  const std::string name = GetParam();
  const std::string path = test::data_path("models/" + name + ".gguf");
  const bool bf16_products = name.ends_with("-f16") || name.ends_with("-bf16");
  const double tol = bf16_products ? kBf16Tolerance : kTinyTolerance;
  auto cpu = load_model(path);
  auto gpu = gpu_model(path);
  ThreadPool pool(2);
  kernels::Context ctx{&pool, best_cpu_path()};
  std::mt19937 rng(7);
  for (size_t len : {1u, 5u, 23u}) {
    std::vector<int32_t> prompt(len);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % cpu->config().vocab_size);
    std::vector<int32_t> cpu_tokens;
    auto ref = trajectory(*cpu, ctx, prompt, {}, 24, &cpu_tokens);
    auto got = trajectory(*gpu, ctx, prompt, cpu_tokens, 24, nullptr);  // teacher-forced
    const double d = max_rel_diff(ref, got);
    EXPECT_LE(d, tol) << name << " prompt " << len;
    expect_greedy_agrees(ref, got, tol, name + " prompt " + std::to_string(len));
    std::printf("[gpu-vs-cpu] %s prompt %zu: max diff %.3g of the largest logit\n", name.c_str(),
                len, d);
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, TinyGpuTest,
                         ::testing::Values("tiny-llama-f32", "tiny-llama-f16", "tiny-llama-bf16",
                                           "tiny-llama-q4_0", "tiny-llama-q4_1", "tiny-llama-q8_0",
                                           "tiny-llama-q4_k", "tiny-llama-q5_k", "tiny-llama-q6_k",
                                           "tiny-llama3-f32", "tiny-mistral-f32",
                                           "tiny-mistral-sw4-f32"));

// Int8 mode: the GPU (matmul_q8 for Q4_K and Q6_K) against the CPU in int8
// mode. Both quantize activations with the same formula (bit for bit on the
// same input, matmul_q8_test.cpp) and differ in summation order only, so
// most runs agree to about 3e-7 of the largest logit. But the inputs of a
// quantization differ by float rounding (1e-7) between the devices, and now
// and then one lands on the other side of a rounding boundary: that code
// moves by one step, d = amax / 127, the size of int8 mode's own rounding,
// which moves these models' logits by 1-2e-2 against exact mode (measured
// on the CPU). Seen on the GPU: 2 of 80 prompt lengths, and with the
// norm's reduction order of 2026-12-01, 2 of the 5 below for tiny Q6_K. So
// each prompt is held to kInt8Tolerance (3e-2), and most prompts (a
// majority) to kInt8Close (1e-5).
constexpr double kInt8Close = 1e-5;
class TinyGpuInt8Test : public ::testing::TestWithParam<const char*> {};

TEST_P(TinyGpuInt8Test, LogitsMatchCpuInt8AndGreedyAgrees) {
  const std::string name = GetParam();
  const std::string path = test::data_path("models/" + name + ".gguf");
  auto cpu = load_model(path);
  auto gpu = gpu_model(path, true, true, kernels::MatmulMode::Int8);
  ThreadPool pool(2);
  kernels::Context ctx{&pool, best_cpu_path(), kernels::MatmulMode::Int8};
  std::mt19937 rng(11);
  size_t close = 0, runs = 0;
  for (size_t len : {1u, 7u, 30u, 12u, 21u}) {
    std::vector<int32_t> prompt(len);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % cpu->config().vocab_size);
    std::vector<int32_t> cpu_tokens;
    auto ref = trajectory(*cpu, ctx, prompt, {}, 24, &cpu_tokens);
    auto got = trajectory(*gpu, ctx, prompt, cpu_tokens, 24, nullptr);
    const double d = max_rel_diff(ref, got);
    EXPECT_LE(d, kInt8Tolerance) << name << " prompt " << len;
    if (d <= kInt8Close) {  // no code rounded the other way: greedy choices must agree
      expect_greedy_agrees(ref, got, kInt8Close, name + " prompt " + std::to_string(len));
      ++close;
    }
    ++runs;
    std::printf("[gpu-vs-cpu int8] %s prompt %zu: max diff %.3g of the largest logit\n",
                name.c_str(), len, d);
  }
  EXPECT_GE(close, runs / 2 + 1) << name << ": most prompts beyond " << kInt8Close;
}

INSTANTIATE_TEST_SUITE_P(TinyModels, TinyGpuInt8Test,
                         ::testing::Values("tiny-llama-q4_k", "tiny-llama-q6_k"));

TEST(SmolLM2Gpu, LogitsMatchCpuAndGreedy32Identical) {
  const std::string path = test::smollm2_path();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path;
  auto cpu = load_model(path);
  auto gpu = gpu_model(path);
  ThreadPool pool(8);
  kernels::Context ctx{&pool, best_cpu_path()};
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 504, 3458, 282, 4649, 314},  // a few real-vocabulary ids
      {1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3437, 30, 2},
      {1, 28, 3, 500, 7000, 12, 12, 12, 99, 4000, 41000, 17, 300, 30000}};
  for (const auto& p : prompts) {
    std::vector<int32_t> cpu_tokens, gpu_tokens;
    auto ref = trajectory(*cpu, ctx, p, {}, 32, &cpu_tokens);
    auto got = trajectory(*gpu, ctx, p, {}, 32, &gpu_tokens);  // the GPU's own greedy choices
    EXPECT_EQ(cpu_tokens, gpu_tokens);
    const double d = max_rel_diff(ref, got);
    if (cpu_tokens == gpu_tokens) {
      EXPECT_LE(d, kSmolTolerance);
    }
    std::printf("[gpu-vs-cpu] SmolLM2 prompt of %zu: max diff %.3g of the largest logit\n",
                p.size(), d);
  }
}

// A step that reduces its outputs on the device (greedy sampling's and top
// logprobs' path; sampled rows' drawn token) gives the same largest logits
// and tokens, bit for bit, as the whole rows of the same step reduced on the
// host; rows asking for their whole row get it beside reduced ones in one
// step.
TEST(GpuOutputs, ReducedStepsMatchWholeRows) {
  const std::string path = test::data_path("models/tiny-llama3-f32.gguf");
  auto gpu = gpu_model(path);
  ThreadPool pool(2);
  kernels::Context ctx{&pool, best_cpu_path()};
  const kv::KvSpec spec = gpu->config().kv_spec(kernels::KvFormat::f16(), kernels::KvFormat::f16());
  kv::BatchKv whole(spec, gpu->kv_allocator()), part(spec, gpu->kv_allocator());
  const std::vector<std::vector<int32_t>> prompts = {{5, 9, 2, 7}, {3, 1}, {8, 8, 8}};
  std::vector<size_t> lens;
  for (const auto& p : prompts) lens.push_back(p.size());
  whole.prepare_prefill(lens);
  part.prepare_prefill(lens);
  std::vector<RowInput> in;
  for (const auto& p : prompts) in.push_back(RowInput{p});
  const size_t V = gpu->config().vocab_size;
  std::vector<float> logits;
  StepOutputs out;
  std::vector<int32_t> next(prompts.size());
  for (int step = 0; step < 12; ++step) {
    std::vector<OutputNeed> needs(prompts.size());
    needs[0] = {false, 1, true};
    needs[1] = {false, 7, step % 2 == 0};
    needs[2] = {step % 3 == 0, 3, true};  // now and then the whole row
    // Sampled rows draw on the device; with top logprobs beside a draw.
    needs[1].draw =
        DrawSpec{1.0f / 0.8f, 0, 0.9f, std::log(0.02f), (step * 0.37) - std::floor(step * 0.37)};
    if (step % 2) needs[0].draw = DrawSpec{1.0f, 5, 1.0f, -INFINITY, 0.999};
    // Penalties on the device now and then (one token past the vocabulary).
    const std::vector<DrawPenalty> pens = {
        {3, 0.5f}, {2, 0.0f}, {7, 1.5f}, {static_cast<int32_t>(V) + 1, 1.0f}};
    if (step % 3 == 1) {
      needs[1].draw->repetition = 1.2f;
      needs[1].penalties = pens;
    }
    gpu->forward(ctx, whole, in, logits);
    gpu->step(ctx, part, in, needs, out);
    if (step == 0) {
      whole.finalize_prefill();
      part.finalize_prefill();
    }
    ASSERT_EQ(out.size(), prompts.size());
    for (size_t o = 0; o < prompts.size(); ++o) {
      const std::span<const float> row(&logits[o * V], V);
      const RowLogits got = out.row(o);
      std::vector<TopLogit> want;
      LogSumExp lse;
      select_from_row(row, needs[o].top_n, want, &lse);
      if (needs[o].full) {
        ASSERT_EQ(got.full.size(), V);
        EXPECT_TRUE(std::equal(row.begin(), row.end(), got.full.begin())) << "step " << step;
      } else {
        ASSERT_EQ(got.top.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
          EXPECT_EQ(got.top[i].id, want[i].id) << "step " << step << " output " << o;
          EXPECT_EQ(got.top[i].value, want[i].value) << "step " << step << " output " << o;
        }
        if (needs[o].lse) {
          EXPECT_EQ(got.lse.max, lse.max);
          EXPECT_NEAR(got.lse.sum, lse.sum, 1e-12 * lse.sum);
        }
        if (needs[o].draw) {
          std::vector<float> penalised(row.begin(), row.end());
          apply_draw_penalties(penalised, needs[o].draw->repetition, needs[o].penalties);
          const TopLogit d = draw_from_row(penalised, *needs[o].draw);
          EXPECT_EQ(got.drawn.id, d.id) << "step " << step << " output " << o;
          ASSERT_GE(d.id, 0);
          EXPECT_EQ(got.drawn.value, row[static_cast<size_t>(d.id)])  // the raw logit
              << "step " << step << " output " << o;
        } else {
          EXPECT_EQ(got.drawn.id, -1) << "step " << step << " output " << o;
        }
      }
      next[o] = want.empty() ? 0 : want[0].id;
    }
    for (size_t o = 0; o < prompts.size(); ++o)
      in[o] = RowInput{std::span<const int32_t>(&next[o], 1)};
  }
}

// Three prompts prefilled, then greedy decode steps (each model feeds back
// its own argmax); at step 30 the middle row leaves (a new step shape) and
// the cache grows past its first allocation. Returns every step's logits,
// concatenated, and the steps' offsets into them. The cache: K q4g64 and V
// f16 (f16 both where head_dim is not a multiple of 64), or `kv` for both.
std::vector<float> greedy_steps(const Model& m, int steps, std::vector<size_t>* offsets,
                                std::optional<kernels::KvFormat> kv_format = std::nullopt) {
  ThreadPool pool(2);
  kernels::Context ctx{&pool, best_cpu_path()};
  const kv::KvSpec spec = kv_format ? m.config().kv_spec(*kv_format, *kv_format)
                                    : m.config().kv_spec(m.config().head_dim % 64 == 0
                                                             ? kernels::KvFormat::affine(4, 64)
                                                             : kernels::KvFormat::f16(),
                                                         kernels::KvFormat::f16());
  kv::BatchKv kv(spec, m.kv_allocator());
  const std::vector<std::vector<int32_t>> prompts = {{5, 9, 2, 7}, {3, 1}, {8, 8, 8, 1, 2}};
  std::vector<size_t> lens;
  for (const auto& p : prompts) lens.push_back(p.size());
  kv.prepare_prefill(lens);
  std::vector<RowInput> in;
  for (const auto& p : prompts) in.push_back(RowInput{p});
  const size_t V = m.config().vocab_size;
  std::vector<float> all, logits;
  std::vector<int32_t> next(prompts.size());
  for (int step = 0; step < steps; ++step) {
    if (step == 30) {  // the middle row leaves
      const std::vector<size_t> keep = {0, 2};
      kv.filter(keep);
      next = {next[0], next[2]};
      in.resize(2);
    }
    m.forward(ctx, kv, in, logits);
    if (step == 0) kv.finalize_prefill();
    if (offsets) offsets->push_back(all.size());
    all.insert(all.end(), logits.begin(), logits.end());
    for (size_t o = 0; o < in.size(); ++o) {
      next[o] = static_cast<int32_t>(argmax(&logits[o * V], V));
      in[o] = RowInput{std::span<const int32_t>(&next[o], 1)};
    }
  }
  return all;
}

// The first step whose logits differ, or -1.
int first_different_step(const std::vector<float>& a, const std::vector<float>& b,
                         const std::vector<size_t>& offsets) {
  if (a.size() != b.size()) return 0;
  for (size_t s = 0; s < offsets.size(); ++s) {
    const size_t end = s + 1 < offsets.size() ? offsets[s + 1] : a.size();
    if (std::memcmp(&a[offsets[s]], &b[offsets[s]], (end - offsets[s]) * sizeof(float)) != 0)
      return static_cast<int>(s);
  }
  return -1;
}

// Steps replayed from CUDA graphs give the bits of steps launched kernel by
// kernel: decode steps of one shape (the second captures, later ones
// replay), then a new shape while graphs replay.
TEST(GpuGraphs, ReplayedStepsMatchDirectOnes) {
  const std::string path = test::data_path("models/tiny-llama-q4_k.gguf");
  std::vector<size_t> offsets;
  const std::vector<float> direct = greedy_steps(*gpu_model(path, true, false), 80, &offsets);
  const std::vector<float> graphed = greedy_steps(*gpu_model(path, true, true), 80, nullptr);
  EXPECT_EQ(first_different_step(direct, graphed, offsets), -1);
}

// Decode steps of bf16 Q/K/V weights on Hopper run rope and the KV write in
// the Q/K/V product's epilogue (the backend's PendingQkv): with it and
// without it (FERRY_CUDA_FUSE_QKV=0) every step's logits are the same
// bits, kernel by kernel and from graphs, for each dense cache. (The tiny
// model's head_dim of 16 takes no affine cache; the affine case, rotation
// fused and the write apart, is tested on the kernel: matmul_tc_test.)
TEST(GpuLaunches, QkvEpilogueChangesNoBit) {
  const std::string path = test::data_path("models/tiny-llama-bf16.gguf");
  int dev = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, dev), cudaSuccess);
  if (prop.major == 9) {  // the tiny model's Q/K/V (64 -> 64 + 32 + 32) take the fused tile
    EXPECT_TRUE(cuda::matmul_tc_qkv_rope_applies(64, 128, 3));
  }
  for (bool graphs : {false, true})
    for (const kernels::KvFormat& f :
         {kernels::KvFormat::bf16(), kernels::KvFormat::f16(), kernels::KvFormat::f32()}) {
      std::vector<size_t> offsets;
      ASSERT_EQ(setenv("FERRY_CUDA_FUSE_QKV", "0", 1), 0);
      const std::vector<float> apart =
          greedy_steps(*gpu_model(path, true, graphs), 40, &offsets, f);
      ASSERT_EQ(unsetenv("FERRY_CUDA_FUSE_QKV"), 0);
      const std::vector<float> fused = greedy_steps(*gpu_model(path, true, graphs), 40, nullptr, f);
      EXPECT_EQ(first_different_step(apart, fused, offsets), -1)
          << f.name() << (graphs ? " with graphs" : " kernel by kernel");
    }
}

// Attention reads its job, stages its settled keys and, after kv_store,
// folds them before its dependency wait (AttentionFormats): the same bits
// as reading nothing early (FERRY_CUDA_ATTN_EARLY=0) and as staging only,
// for dense and affine caches, head_dim 64 and 128, kernel by kernel and
// replayed from graphs. This runs the backend's choice (which list is
// settled, which launch came last) and the settled counts end to end.
TEST(GpuLaunches, EarlyAttentionChangesNoBit) {
  for (const auto& [heads, kv_heads, hd] :
       {std::tuple<uint32_t, uint32_t, uint32_t>{4, 2, 64}, {2, 1, 128}}) {
    const std::string path = test::wide_head_model(heads, kv_heads, hd);
    for (bool graphs : {false, true})
      for (const kernels::KvFormat& f :
           {kernels::KvFormat::bf16(), kernels::KvFormat::affine(4, 64),
            kernels::KvFormat::affine(8, 32)}) {
        const std::string what = f.name() + " head_dim " + std::to_string(hd) +
                                 (graphs ? " with graphs" : " kernel by kernel");
        std::vector<size_t> offsets;
        ASSERT_EQ(setenv("FERRY_CUDA_ATTN_EARLY", "0", 1), 0);
        const std::vector<float> none =
            greedy_steps(*gpu_model(path, true, graphs), 40, &offsets, f);
        ASSERT_EQ(setenv("FERRY_CUDA_ATTN_EARLY", "stage", 1), 0);
        const std::vector<float> staged =
            greedy_steps(*gpu_model(path, true, graphs), 40, nullptr, f);
        ASSERT_EQ(unsetenv("FERRY_CUDA_ATTN_EARLY"), 0);
        const std::vector<float> folded =
            greedy_steps(*gpu_model(path, true, graphs), 40, nullptr, f);
        EXPECT_EQ(first_different_step(none, staged, offsets), -1) << "staged, " << what;
        EXPECT_EQ(first_different_step(none, folded, offsets), -1) << "folded, " << what;
      }
    std::filesystem::remove(path);
  }
}

// Dependent launches (a kernel's blocks starting while the kernel before it
// finishes, the weights' first stages requested before its inputs are
// ready) change no bit, kernel by kernel and replayed from graphs, on the
// tensor-core (bf16, f16), int8 (Q4_K) and f32 paths.
TEST(GpuLaunches, DependentLaunchChangesNoBit) {
  int dev = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, dev), cudaSuccess);
  if (prop.major >= 9) {
    EXPECT_TRUE(cuda::dependent_launch(dev));  // on by default there
  }
  struct Case {
    const char* model;
    kernels::MatmulMode matmul;
  };
  for (const Case c : {Case{"tiny-llama-bf16", kernels::MatmulMode::Exact},
                       Case{"tiny-llama-f16", kernels::MatmulMode::Exact},
                       Case{"tiny-llama-q4_k", kernels::MatmulMode::Int8},
                       Case{"tiny-llama-f32", kernels::MatmulMode::Exact}}) {
    const std::string path = test::data_path(std::string("models/") + c.model + ".gguf");
    for (bool graphs : {false, true}) {
      std::vector<size_t> offsets;
      cuda::set_dependent_launch(false);
      const std::vector<float> plain =
          greedy_steps(*gpu_model(path, true, graphs, c.matmul), 40, &offsets);
      cuda::set_dependent_launch(true);
      EXPECT_TRUE(cuda::dependent_launch(dev) || prop.major < 9);
      const std::vector<float> dependent =
          greedy_steps(*gpu_model(path, true, graphs, c.matmul), 40, nullptr);
      cuda::set_dependent_launch(std::nullopt);
      EXPECT_EQ(first_different_step(plain, dependent, offsets), -1)
          << c.model << (graphs ? " with graphs" : " kernel by kernel");
    }
  }
}

// `rows` random prompts of `len` tokens, prefilled in one step of m; their
// last tokens' logits [rows, vocab].
struct BigStep {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<float> logits;
};
BigStep big_step(const Model& m, const kernels::Context& ctx, const kv::KvSpec& spec, size_t rows,
                 size_t len, uint32_t seed) {
  BigStep b;
  const size_t V = m.config().vocab_size;
  std::mt19937 rng(seed);
  b.prompts.assign(rows, std::vector<int32_t>(len));
  for (auto& p : b.prompts)
    for (auto& t : p) t = static_cast<int32_t>(rng() % V);
  kv::BatchKv big(spec, m.kv_allocator());
  big.prepare_prefill(std::vector<size_t>(rows, len));
  std::vector<RowInput> in;
  for (const auto& p : b.prompts) in.push_back(RowInput{p});
  m.forward(ctx, big, in, b.logits);
  EXPECT_EQ(b.logits.size(), rows * V);
  return b;
}

// Row r of a BigStep prefilled alone, `chunk` tokens per step: its last
// logits equal the big step's, bit for bit.
void expect_solo_equal(const Model& m, const kernels::Context& ctx, const kv::KvSpec& spec,
                       const BigStep& b, size_t r, size_t chunk, const std::string& what) {
  const size_t V = m.config().vocab_size, len = b.prompts[r].size();
  kv::BatchKv solo(spec, m.kv_allocator());
  solo.prepare_prefill(std::vector<size_t>{len});
  std::vector<float> one;
  for (size_t i = 0; i < len; i += chunk) {
    const RowInput row{std::span<const int32_t>(b.prompts[r]).subspan(i, std::min(chunk, len - i))};
    m.forward(ctx, solo, std::span<const RowInput>(&row, 1), one);
  }
  ASSERT_EQ(one.size(), V);
  EXPECT_EQ(std::memcmp(one.data(), &b.logits[r * V], V * sizeof(float)), 0)
      << what << " row " << r;
}

// A step large enough to outgrow the backend's staging mid-step (40 rows of
// 200 prompt tokens: megabytes of job lists) gives every row the logits it
// gets alone, bit for bit.
TEST(GpuLargeStep, RowsMatchSoloAcrossStagingGrowth) {
  auto gpu = gpu_model(test::data_path("models/tiny-llama3-f32.gguf"));
  ThreadPool pool(2);
  kernels::Context ctx{&pool, best_cpu_path()};
  const kv::KvSpec spec = gpu->config().kv_spec(kernels::KvFormat::f16(), kernels::KvFormat::f16());
  const BigStep b = big_step(*gpu, ctx, spec, 40, 200, 9);
  for (size_t r = 0; r < 40; r += 13) expect_solo_equal(*gpu, ctx, spec, b, r, 200, "f32");
}

// Dense weights change product kernels with the step's rows (matmul_tc:
// weight-streaming mma.sync tiles up to 32 rows; on Hopper wgmma tiles and,
// for bf16, gate/up/SwiGLU in one launch above): 12 prompts of 40 tokens in
// one 480-row step give each row's last logits bit for bit as the row alone
// does, prefilled 5 tokens at a time (steps of 5 rows).
TEST(GpuLargeStep, DenseRowsMatchSoloAcrossKernelSwitch) {
  for (const char* name : {"tiny-llama-bf16", "tiny-llama-f16"}) {
    auto gpu = gpu_model(test::data_path(std::string("models/") + name + ".gguf"));
    ThreadPool pool(2);
    kernels::Context ctx{&pool, best_cpu_path()};
    const kv::KvSpec spec =
        gpu->config().kv_spec(kernels::KvFormat::f16(), kernels::KvFormat::f16());
    const BigStep b = big_step(*gpu, ctx, spec, 12, 40, 21);
    for (size_t r = 0; r < 12; r += 5) expect_solo_equal(*gpu, ctx, spec, b, r, 5, name);
  }
}

// The same in fast mode with 12 rows, whose products go to cuBLAS: the
// captured cuBLAS calls replay the bits of direct ones.
TEST(GpuGraphs, FastModeReplaysCublasBitForBit) {
  const std::string path = test::data_path("models/tiny-llama-q4_k.gguf");
  auto direct = gpu_model(path, false, false);
  auto graphed = gpu_model(path, false, true);
  ThreadPool pool(2);
  kernels::Context ctx{&pool, best_cpu_path()};
  const kv::KvSpec spec =
      direct->config().kv_spec(kernels::KvFormat::f16(), kernels::KvFormat::f16());
  kv::BatchKv a(spec, direct->kv_allocator()), b(spec, graphed->kv_allocator());
  const size_t rows = 12, V = direct->config().vocab_size;
  std::vector<std::vector<int32_t>> prompts(rows);
  for (size_t r = 0; r < rows; ++r) prompts[r] = {static_cast<int32_t>(r + 1), 7, 3};
  a.prepare_prefill(std::vector<size_t>(rows, 3));
  b.prepare_prefill(std::vector<size_t>(rows, 3));
  std::vector<RowInput> in;
  for (const auto& p : prompts) in.push_back(RowInput{p});
  std::vector<float> la, lb;
  std::vector<int32_t> next(rows);
  for (int step = 0; step < 10; ++step) {
    direct->forward(ctx, a, in, la);
    graphed->forward(ctx, b, in, lb);
    if (step == 0) {
      a.finalize_prefill();
      b.finalize_prefill();
    }
    ASSERT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0) << "step " << step;
    for (size_t o = 0; o < rows; ++o) {
      next[o] = static_cast<int32_t>(argmax(&la[o * V], V));
      in[o] = RowInput{std::span<const int32_t>(&next[o], 1)};
    }
  }
}

// --fp8 (fast mode): the layers' weights rounded to E4M3 (and, in steps of
// more than 8 rows, each product's activations too), whose 3 mantissa bits
// leave a relative error of up to 2^-4 per value, so a product's output
// moves by a few percent and the logits by more after the layers; these
// tiny models (hidden 64) average little of it out. On an H100 (2026-12-06)
// they measured 0.066-0.171 of the largest logit and greedy agreement of
// 18-24 of 24 steps on each prompt. The bound, kFp8Tolerance, is twice the
// largest measured difference, and the greedy token must be the CPU's at
// two steps in three or more (near-ties flip within the error). The FP8
// logits must also differ from the same GPU's bf16 ones (else the FP8 path
// did not run), and a graph's replay must give the direct run's bits.
constexpr double kFp8Tolerance = 0.35;

class TinyFp8Test : public ::testing::TestWithParam<const char*> {};

TEST_P(TinyFp8Test, LogitsNearCpuAndReplaysBitForBit) {
  const std::string path = test::data_path(std::string("models/") + GetParam() + ".gguf");
  int dev_major = 0, dev_minor = 0;
  cudaDeviceGetAttribute(&dev_major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&dev_minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (dev_major * 10 + dev_minor < 89) GTEST_SKIP() << "no FP8 tensor cores";
  auto cpu = load_model(path);
  auto fp8 = gpu_model(path, false, true, kernels::MatmulMode::Exact, true);
  auto fp8_direct = gpu_model(path, false, false, kernels::MatmulMode::Exact, true);
  auto bf16 = gpu_model(path, false, true);
  ThreadPool pool(2);
  kernels::Context ctx{&pool, best_cpu_path()};
  std::mt19937 rng(3);
  for (size_t len : {1u, 9u, 40u}) {
    std::vector<int32_t> prompt(len);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % cpu->config().vocab_size);
    std::vector<int32_t> cpu_tokens;
    auto ref = trajectory(*cpu, ctx, prompt, {}, 24, &cpu_tokens);
    auto got = trajectory(*fp8, ctx, prompt, cpu_tokens, 24, nullptr);
    auto direct = trajectory(*fp8_direct, ctx, prompt, cpu_tokens, 24, nullptr);
    auto plain = trajectory(*bf16, ctx, prompt, cpu_tokens, 24, nullptr);
    const double d = max_rel_diff(ref, got);
    EXPECT_LE(d, kFp8Tolerance) << GetParam() << " prompt " << len;
    EXPECT_GT(max_rel_diff(plain, got), 0.0) << GetParam() << ": FP8 gave the bf16 logits";
    for (size_t s = 0; s < got.size(); ++s)
      ASSERT_EQ(std::memcmp(got[s].data(), direct[s].data(), got[s].size() * sizeof(float)), 0)
          << GetParam() << " prompt " << len << " step " << s << ": replay differs";
    size_t agree = 0;
    for (size_t s = 0; s < ref.size(); ++s)
      agree += argmax(ref[s].data(), ref[s].size()) == argmax(got[s].data(), got[s].size());
    EXPECT_GE(agree * 3, ref.size() * 2)
        << GetParam() << " prompt " << len << ": greedy agreed " << agree << " of " << ref.size();
    std::printf(
        "[fp8-vs-cpu] %s prompt %zu: max diff %.3g of the largest logit (bf16 GPU %.3g), greedy "
        "%zu of %zu\n",
        GetParam(), len, d, max_rel_diff(ref, plain), agree, ref.size());
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, TinyFp8Test,
                         ::testing::Values("tiny-llama-f32", "tiny-llama-bf16", "tiny-llama-f16",
                                           "tiny-llama3-f32"));

// --fp8 outside fast mode is refused when the backend is made.
TEST(GpuFp8, DeterministicModeIsRefused) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  cuda::CudaOptions o;
  o.fp8 = true;
  try {
    cuda::make_backend(o);
    FAIL() << "--fp8 with deterministic kernels was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("--fp8 runs with --no-deterministic"), std::string::npos)
        << e.what();
  }
}

// Row operations on device memory leave the same bytes as on the host: the
// same K/V rows written through each backend's kv_write (byte-identical
// encoders), then the same operations on both caches, then every valid
// (layer, row, column, head) compared byte for byte.
void expect_same_bytes(const kv::BatchKv& host, const kv::BatchKv& dev) {
  ASSERT_EQ(host.rows(), dev.rows());
  for (size_t l = 0; l < host.spec().layers.size(); ++l) {
    const kv::KvView hv = host.capture(l), dv = dev.capture(l);
    for (size_t r = 0; r < host.rows(); ++r) {
      const kv::RowState& hr = host.table().row(r);
      ASSERT_EQ(hr.start, dev.table().row(r).start);
      ASSERT_EQ(hr.end, dev.table().row(r).end);
      if (hr.end == hr.start) continue;
      kernels::KvSide hk, hvs, dk, dvs;
      const kernels::AttentionTask ht = hv.task(r, hr.start, hr.end - 1, &hk, &hvs);
      const kernels::AttentionTask dt = dv.task(r, hr.start, hr.end - 1, &dk, &dvs);
      for (int side = 0; side < 2; ++side) {
        const kernels::KvSide& a = side ? hvs : hk;
        const kernels::KvSide& b = side ? dvs : dk;
        for (size_t p = 0; p < 3 && a.plane[p]; ++p)
          for (size_t h = 0; h < host.spec().n_kv_heads; ++h)
            for (int s = 0; s < 2; ++s) {
              const size_t n = ht.seg[s].end - ht.seg[s].begin;
              ASSERT_EQ(n, dt.seg[s].end - dt.seg[s].begin);
              if (n == 0) continue;
              std::vector<uint8_t> want(
                  a.plane[p] + h * a.head_stride[p] + ht.seg[s].begin * a.unit[p],
                  a.plane[p] + h * a.head_stride[p] + ht.seg[s].end * a.unit[p]);
              std::vector<uint8_t> got(want.size());
              ASSERT_EQ(cudaMemcpy(got.data(),
                                   b.plane[p] + h * b.head_stride[p] + dt.seg[s].begin * b.unit[p],
                                   got.size(), cudaMemcpyDeviceToHost),
                        cudaSuccess);
              ASSERT_EQ(want, got) << "layer " << l << " row " << r << " side " << side << " plane "
                                   << p << " head " << h;
            }
      }
    }
  }
}

void row_operations_byte_exact() {
  auto be = cuda::make_backend({});
  ThreadPool pool(1);
  kernels::Context ctx{&pool, best_cpu_path()};
  CpuBackend cpu(ctx);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (const char* fmt : {"f32", "f16", "q8g32", "q4g64"}) {
    const kernels::KvFormat f = kernels::parse_kv_format(fmt);
    kv::KvSpec spec = kv::KvSpec::uniform(3, 2, 64, f, f);
    spec.layers[1].window = 6;  // one ring layer
    const size_t kv_dim = 2 * 64;
    kv::BatchKv h(spec), d(spec, be->kv_allocator());
    // Steps of random tokens for rows of random lengths, written through
    // each backend.
    auto step = [&](std::vector<size_t> counts) {
      size_t T = 0;
      for (size_t c : counts) T += c;
      std::vector<float> k(T * kv_dim), v(T * kv_dim);
      for (auto& x : k) x = nd(rng);
      for (auto& x : v) x = nd(rng);
      std::vector<TokenPlace> places;
      for (size_t r = 0; r < counts.size(); ++r)
        for (size_t i = 0; i < counts[r]; ++i) places.push_back({r, i});
      h.reserve(counts);
      d.reserve(counts);
      float* dk = nullptr;
      float* dv = nullptr;
      ASSERT_EQ(cudaMalloc(&dk, k.size() * 4), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dv, v.size() * 4), cudaSuccess);
      cudaMemcpy(dk, k.data(), k.size() * 4, cudaMemcpyHostToDevice);
      cudaMemcpy(dv, v.data(), v.size() * 4, cudaMemcpyHostToDevice);
      for (size_t l = 0; l < 3; ++l) {
        cpu.kv_write(h, l, places, k.data(), v.data());
        be->kv_write(d, l, places, dk, dv);
      }
      cudaDeviceSynchronize();
      cudaFree(dk);
      cudaFree(dv);
      h.commit(counts);
      d.commit(counts);
    };
    const std::vector<size_t> lens = {5, 2, 9};
    h.prepare_prefill(lens);
    d.prepare_prefill(lens);
    step(lens);
    h.finalize_prefill();
    d.finalize_prefill();
    for (int s = 0; s < 4; ++s) step({1, 1, 1});
    expect_same_bytes(h, d);
    // extend with a new row, decode, spec round with rollback, filter,
    // extract, align, merge, trim.
    kv::BatchKv hn(spec), dn(spec, be->kv_allocator());
    const size_t one[] = {4};
    hn.prepare_prefill(one);
    dn.prepare_prefill(one);
    {
      // Write the newcomer's prompt through the same step helper.
      std::swap(h, hn);
      std::swap(d, dn);
      step({4});
      h.finalize_prefill();
      d.finalize_prefill();
      std::swap(h, hn);
      std::swap(d, dn);
    }
    h.extend(hn);
    d.extend(dn);
    expect_same_bytes(h, d);
    h.spec_begin();
    d.spec_begin();
    step({3, 3, 3, 3});
    const size_t keep[] = {1, 3, 0, 2};
    h.spec_rollback(keep);
    d.spec_rollback(keep);
    expect_same_bytes(h, d);
    const size_t kept[] = {0, 2, 3};
    h.filter(kept);
    d.filter(kept);
    expect_same_bytes(h, d);
    step({1, 1, 1});
    expect_same_bytes(h.extract(1), d.extract(1));
    const size_t pads[] = {3, 0, 1};
    h.align(pads);
    d.align(pads);
    expect_same_bytes(h, d);
    kv::BatchKv he = h.extract(0), de = d.extract(0);
    std::vector<const kv::BatchKv*> hp{&h, &he}, dp{&d, &de};
    kv::BatchKv hm = kv::BatchKv::merge(hp), dm = kv::BatchKv::merge(dp);
    expect_same_bytes(hm, dm);
    hm.trim(1);
    dm.trim(1);
    expect_same_bytes(hm, dm);
    EXPECT_EQ(hm.allocated_bytes(), dm.allocated_bytes());  // the same accounting
  }
}

TEST(GpuKv, RowOperationsAreByteExactWithHost) {
  row_operations_byte_exact();
}

// The same on a device without memory pools (KV planes from cudaMalloc,
// freed by cudaFree), forced by FERRY_CUDA_KV_POOL=0.
TEST(GpuKv, RowOperationsAreByteExactWithoutMemoryPool) {
  ASSERT_EQ(setenv("FERRY_CUDA_KV_POOL", "0", 1), 0);
  row_operations_byte_exact();
  unsetenv("FERRY_CUDA_KV_POOL");
}

// The device allocator's batched copies leave the bytes the host
// allocator's one-by-one copies do: copy_batch (one kv_copy launch) over
// 3,000 copies of aligned and unaligned widths, pitches and addresses, run
// twice so its descriptor list grows; copy_moves (through a bounce from
// the pool) over a filter's chain of moves in one buffer, where each
// move's destination was an earlier move's source.
TEST(GpuKv, BatchedCopiesEqualHostCopies) {
  auto be = cuda::make_backend({});
  const std::shared_ptr<kv::KvAllocator> dev = be->kv_allocator(),
                                         host = kv::KvAllocator::standard();
  std::mt19937 rng(11);
  auto fill = [&](std::vector<uint8_t>& v) {
    for (auto& b : v) b = static_cast<uint8_t>(rng());
  };
  // A host buffer and its device twin.
  struct Twin {
    std::shared_ptr<kv::KvBuffer> h, d;
  };
  auto twin = [&](const std::vector<uint8_t>& bytes) {
    Twin t{host->allocate(bytes.size()), dev->allocate(bytes.size())};
    std::memcpy(t.h->data, bytes.data(), bytes.size());
    EXPECT_EQ(cudaDeviceSynchronize(),
              cudaSuccess);  // (the zero fill runs on the backend's stream)
    EXPECT_EQ(cudaMemcpy(t.d->data, bytes.data(), bytes.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    return t;
  };
  auto same = [&](const Twin& t) {
    std::vector<uint8_t> got(t.h->size);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(got.data(), t.d->data, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return std::memcmp(got.data(), t.h->data, got.size()) == 0;
  };
  for (size_t n_copies : {300, 3000}) {
    std::vector<uint8_t> src_bytes(size_t{1} << 20), dst_bytes(size_t{4} << 20);
    fill(src_bytes);
    fill(dst_bytes);
    const Twin src = twin(src_bytes), dst = twin(dst_bytes);
    std::vector<kv::KvAllocator::Copy2d> hc, dc;
    size_t at = 0;  // destinations one after another: disjoint
    for (size_t i = 0; i < n_copies; ++i) {
      const size_t width = i % 3 == 0 ? 16 * (1 + rng() % 20) : 1 + rng() % 300;
      const size_t height = 1 + rng() % 8, pitch = width + (i % 2 ? 16 * (rng() % 3) : rng() % 7);
      const size_t from = (i % 4 == 0 ? 16 : 1) * (rng() % 1000);
      const size_t to = (at + 15) / 16 * 16 + (i % 5 == 0 ? 3 : 0);
      at = to + (height - 1) * pitch + width;
      ASSERT_LE(at, dst_bytes.size());
      ASSERT_LE(from + (height - 1) * pitch + width, src_bytes.size());
      hc.push_back({dst.h->data + to, pitch, src.h->data + from, pitch, width, height});
      dc.push_back({dst.d->data + to, pitch, src.d->data + from, pitch, width, height});
    }
    host->copy_batch(hc);
    dev->copy_batch(dc);
    EXPECT_TRUE(same(dst)) << n_copies << " copies";
  }
  // A filter's moves: rows keep[i] -> i of 96-byte rows in two planes
  // (heights 1 and 3 with the plane's pitch), in row order.
  const size_t rows = 200, unit = 96, heads = 3;
  std::vector<uint8_t> plane_bytes(rows * unit * heads);
  fill(plane_bytes);
  const Twin plane = twin(plane_bytes);
  std::vector<size_t> keep;
  for (size_t r = 0; r < rows; ++r)
    if (rng() % 3 != 0) keep.push_back(r);
  std::vector<kv::KvAllocator::Copy2d> hm, dm;
  for (size_t i = 0; i < keep.size(); ++i) {
    if (keep[i] == i) continue;
    hm.push_back({plane.h->data + i * unit, rows * unit, plane.h->data + keep[i] * unit,
                  rows * unit, unit, heads});
    dm.push_back({plane.d->data + i * unit, rows * unit, plane.d->data + keep[i] * unit,
                  rows * unit, unit, heads});
  }
  ASSERT_GT(hm.size(), 50u);
  host->copy_moves(hm);
  dev->copy_moves(dm);
  EXPECT_TRUE(same(plane)) << hm.size() << " moves";
}

// The randomized schedule of tests/model on the GPU (deterministic mode):
// every row's logits at every step bit-identical to its solo run.
class GpuScheduleTest : public ::testing::TestWithParam<std::tuple<const char*, const char*>> {};

TEST_P(GpuScheduleTest, RowsMatchSoloBitForBit) {
  auto [model, fmt] = GetParam();
  auto m = gpu_model(test::data_path(std::string("models/") + model + ".gguf"));
  const kernels::KvFormat f = kernels::parse_kv_format(fmt);
  for (uint32_t seed : {1u, 2u}) run_schedule(*m, f, f, 16, seed);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, GpuScheduleTest,
                         ::testing::Values(std::tuple("tiny-llama-f32", "f32"),
                                           std::tuple("tiny-llama-q8_0", "f16"),
                                           std::tuple("tiny-mistral-sw4-f32", "bf16"),
                                           std::tuple("tiny-llama-q4_k", "q8g32"),
                                           std::tuple("tiny-llama-q4_k", "q4g64")));

// Int8 mode keeps the promise too: matmul_q8's tile variants change with
// the step's row count, its results do not.
TEST(GpuScheduleInt8, RowsMatchSoloBitForBit) {
  for (const char* model : {"tiny-llama-q4_k", "tiny-llama-q6_k"}) {
    auto m = gpu_model(test::data_path(std::string("models/") + model + ".gguf"), true, true,
                       kernels::MatmulMode::Int8);
    run_schedule(*m, kernels::KvFormat::f16(), kernels::KvFormat::f16(), 16, 5);
  }
}

TEST(SmolLM2GpuSchedule, RowsMatchSoloBitForBit) {
  if (!std::filesystem::exists(test::smollm2_path())) GTEST_SKIP();
  auto m = gpu_model(test::smollm2_path());
  run_schedule(*m, kernels::KvFormat::f16(), kernels::KvFormat::f16(), 8, 1234);
  run_schedule(*m, kernels::parse_kv_format("q4g64"), kernels::parse_kv_format("q4g64"), 8, 99);
}

}  // namespace
}  // namespace ferry::model
