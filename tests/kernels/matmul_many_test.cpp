// kernels::matmul_many (ops.h): several weights of one n_in on one input in
// a single dispatch. Each output must be bit-identical to a separate
// kernels::matmul call, for every weight type, both MatmulMode values,
// every CPU path this machine runs, row counts, thread counts (no pool and
// pools of 1, 2, 3 threads), weights of different n_out (so dispatch chunks
// straddle weights) and mixed types in one call (Int8 mode then mixes int8
// and exact columns in one dispatch). matmul itself is matmul_many with one
// weight, so every result is also checked against a golden computed without
// either: the reference path's column kernel called directly on the whole
// weight (Exact) or matmul_int8_with the reference int8 kernel (Int8).
// matmul_many picks the VNNI int8 kernel on the AVX-512 path when the CPU
// has it, and then cannot reach the plain AVX-512 one; each int8 kernel the
// CPU can run (VNNI and not) is checked against the same golden through
// matmul_int8_with. Output buffers carry a guard tail that must stay
// untouched.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/cpu.h"
#include "core/error.h"
#include "kernels/kernel_test_util.h"
#include "kernels/ops.h"
#include "kernels/path_kernels.h"

namespace ferry::kernels {
namespace {

using test::available_paths;
using test::int8_kernels;
using test::Int8Kernel;
using test::kAllTypes;
using test::random_floats;
using test::random_weights;

bool sanitized() {
  return std::getenv("FERRY_SANITIZED") != nullptr;
}

// An output buffer with a guard tail of NaN sentinels; the body starts as
// sentinels too, so an element matmul_many never wrote cannot pass as
// correct.
constexpr size_t kGuard = 16;
constexpr uint32_t kSentinel = 0x7fc0dead;

struct Out {
  explicit Out(size_t n) : n(n), v(n + kGuard) {
    for (auto& f : v) std::memcpy(&f, &kSentinel, 4);
  }
  float* data() { return v.data(); }
  bool guard_intact() const {
    for (size_t i = n; i < v.size(); ++i)
      if (std::memcmp(&v[i], &kSentinel, 4) != 0) return false;
    return true;
  }
  size_t n;
  std::vector<float> v;
};

bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * 4) == 0;
}

struct WeightSpec {
  DType type;
  size_t n_out;
};

struct Case {
  std::string name;
  size_t n_in;
  std::vector<WeightSpec> weights;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  // One type per call: three weights of different n_out (16 is one grain;
  // 37 and 5 make chunks straddle weight boundaries).
  for (DType t : kAllTypes)
    c.push_back({std::string(dtype_traits(t).name), 256, {{t, 16}, {t, 37}, {t, 5}}});
  // Mixed types in one call: int8-capable next to exact-only weights.
  c.push_back({"Mixed_Q4K_F16_Q80", 512, {{DType::Q4_K, 40}, {DType::F16, 16}, {DType::Q8_0, 9}}});
  c.push_back({"Mixed_Q6K_Q40", 512, {{DType::Q6_K, 33}, {DType::Q4_0, 7}}});
  c.push_back({"Mixed_F32_Q5K_Q41_BF16",
               512,
               {{DType::F32, 17}, {DType::Q5_K, 48}, {DType::Q4_1, 3}, {DType::BF16, 20}}});
  // kMaxMatmulMany weights, eight different types, uneven widths.
  c.push_back({"Mixed_Eight",
               256,
               {{DType::F32, 5},
                {DType::Q4_K, 16},
                {DType::BF16, 3},
                {DType::Q8_0, 21},
                {DType::Q6_K, 8},
                {DType::Q4_1, 1},
                {DType::F16, 32},
                {DType::Q5_K, 11}}});
  // A single weight: matmul's own case.
  c.push_back({"Single_Q4_0", 256, {{DType::Q4_0, 70}}});
  return c;
}

class MatmulManyTest : public ::testing::TestWithParam<Case> {};

TEST_P(MatmulManyTest, EachOutputBitIdenticalToSeparateMatmul) {
  const Case& tc = GetParam();
  const size_t K = tc.n_in, n = tc.weights.size();
  const std::vector<size_t> row_counts = {1, 2, 3, 4, 7, 16, 33, 64};
  const size_t max_rows = 64;

  std::vector<std::vector<uint8_t>> bytes;
  std::vector<WeightView> w;
  for (size_t i = 0; i < n; ++i) {
    const WeightSpec& s = tc.weights[i];
    bytes.push_back(random_weights(s.type, K, s.n_out, 100 + static_cast<uint32_t>(i)));
  }
  for (size_t i = 0; i < n; ++i)
    w.push_back({tc.weights[i].type, bytes[i].data(), K, tc.weights[i].n_out});
  auto x = random_floats(max_rows * K, 5);
  // Rows of different magnitudes and an all-zero block (int8 d = 0).
  for (size_t r = 0; r < max_rows; ++r)
    for (size_t k = 0; k < K; ++k) x[r * K + k] *= 1.0f + static_cast<float>(r % 7);
  std::fill(x.begin() + K, x.begin() + K + 32, 0.0f);

  std::vector<std::unique_ptr<ThreadPool>> pools;
  std::vector<ThreadPool*> pool_ptrs{nullptr};
  for (size_t t : {1u, 2u, 3u}) {
    pools.push_back(std::make_unique<ThreadPool>(t));
    pool_ptrs.push_back(pools.back().get());
  }
  // Under sanitizers every path and thread count still runs, on fewer row
  // counts.
  std::vector<size_t> rows = row_counts;
  if (sanitized()) rows = {1, 3, 4, 16, 33};

  for (MatmulMode mode : {MatmulMode::Exact, MatmulMode::Int8}) {
    const std::string mname(matmul_mode_name(mode));
    for (size_t R : rows) {
      // Goldens: reference kernels on whole weights, no pool, no dispatch.
      std::vector<std::vector<float>> gold(n);
      for (size_t i = 0; i < n; ++i) {
        gold[i].resize(R * w[i].n_out);
        if (mode == MatmulMode::Int8 && int8_matmul_supported(w[i].type))
          matmul_int8_with(reference_kernels().matmul_int8_cols,
                           Context{nullptr, CpuPath::Reference, MatmulMode::Int8}, w[i], x.data(),
                           R, gold[i].data());
        else
          reference_kernels().matmul_cols(w[i], x.data(), R, gold[i].data(), 0, w[i].n_out);
      }
      for (CpuPath p : available_paths())
        for (ThreadPool* pool : pool_ptrs) {
          const Context ctx{pool, p, mode};
          const std::string where = mname + " path=" + std::string(cpu_path_name(p)) +
                                    " threads=" + std::to_string(pool ? pool->size() : 0) +
                                    " rows=" + std::to_string(R);
          std::vector<Out> many, sep;
          std::vector<float*> ys;
          for (size_t i = 0; i < n; ++i) {
            many.emplace_back(R * w[i].n_out);
            sep.emplace_back(R * w[i].n_out);
          }
          for (auto& o : many) ys.push_back(o.data());
          matmul_many(ctx, w, x.data(), R, ys);
          for (size_t i = 0; i < n; ++i) matmul(ctx, w[i], x.data(), R, sep[i].data());
          for (size_t i = 0; i < n; ++i) {
            const size_t len = R * w[i].n_out;
            const std::string which = where + " weight " + std::to_string(i) + " (" +
                                      std::string(dtype_traits(w[i].type).name) + ", n_out " +
                                      std::to_string(w[i].n_out) + ")";
            EXPECT_TRUE(same_bits(many[i].data(), sep[i].data(), len))
                << "many vs matmul, " << which;
            EXPECT_TRUE(same_bits(sep[i].data(), gold[i].data(), len))
                << "matmul vs golden, " << which;
            EXPECT_TRUE(many[i].guard_intact()) << "matmul_many wrote past its output, " << which;
            EXPECT_TRUE(sep[i].guard_intact()) << "matmul wrote past its output, " << which;
          }
        }
      // Every int8 kernel the CPU has (the plain AVX-512 one included when
      // matmul_many would pick VNNI), through a pool.
      if (mode == MatmulMode::Int8)
        for (const Int8Kernel& k : int8_kernels())
          for (size_t i = 0; i < n; ++i) {
            if (!int8_matmul_supported(w[i].type)) continue;
            Out y(R * w[i].n_out);
            matmul_int8_with(k.cols, Context{pool_ptrs.back(), CpuPath::Reference, mode}, w[i],
                             x.data(), R, y.data());
            EXPECT_TRUE(same_bits(y.data(), gold[i].data(), R * w[i].n_out) && y.guard_intact())
                << "int8 kernel " << k.name << " rows=" << R << " weight " << i;
          }
    }
  }
}

// The same weight twice, and two weights reading the same bytes as
// different shapes' prefixes, give two identical outputs.
TEST(MatmulMany, RepeatedWeightGivesRepeatedOutput) {
  const size_t K = 256, N = 24, R = 5;
  auto wb = random_weights(DType::Q4_K, K, N, 9);
  const WeightView w{DType::Q4_K, wb.data(), K, N};
  const WeightView head{DType::Q4_K, wb.data(), K, 9};  // the first 9 rows
  auto x = random_floats(R * K, 4);
  ThreadPool pool(3);
  for (MatmulMode mode : {MatmulMode::Exact, MatmulMode::Int8}) {
    const Context ctx{&pool, best_cpu_path(), mode};
    std::vector<float> a(R * N), b(R * N), c(R * 9), ref(R * N);
    const WeightView ws[] = {w, w, head};
    float* const ys[] = {a.data(), b.data(), c.data()};
    matmul_many(ctx, ws, x.data(), R, ys);
    matmul(ctx, w, x.data(), R, ref.data());
    EXPECT_TRUE(same_bits(a.data(), ref.data(), R * N)) << matmul_mode_name(mode);
    EXPECT_TRUE(same_bits(b.data(), ref.data(), R * N)) << matmul_mode_name(mode);
    for (size_t r = 0; r < R; ++r)
      EXPECT_TRUE(same_bits(&c[r * 9], &ref[r * N], 9)) << matmul_mode_name(mode) << " row " << r;
  }
}

// Calls matmul_many cannot serve are rejected before any work.
TEST(MatmulMany, RejectsBadCalls) {
  const size_t K = 256;
  auto wb = random_weights(DType::Q8_0, K, 16, 1);
  auto wb2 = random_weights(DType::F32, 512, 16, 2);
  auto x = random_floats(2 * 512, 3);
  const WeightView w{DType::Q8_0, wb.data(), K, 16};
  const WeightView other_k{DType::F32, wb2.data(), 512, 16};
  std::vector<float> y(2 * 16 * (kMaxMatmulMany + 1));
  ThreadPool pool(2);
  const Context ctx{&pool, best_cpu_path(), MatmulMode::Int8};
  std::vector<WeightView> too_many(kMaxMatmulMany + 1, w);
  std::vector<float*> too_many_y;
  for (size_t i = 0; i <= kMaxMatmulMany; ++i) too_many_y.push_back(&y[i * 32]);
  EXPECT_THROW(matmul_many(ctx, too_many, x.data(), 2, too_many_y), Error);
  EXPECT_THROW(matmul_many(ctx, {}, x.data(), 2, {}), Error);
  const WeightView two[] = {w, w};
  float* const one_y[] = {y.data()};
  EXPECT_THROW(matmul_many(ctx, two, x.data(), 2, one_y), Error);
  const WeightView mixed_k[] = {w, other_k};
  float* const two_y[] = {y.data(), y.data() + 64};
  EXPECT_THROW(matmul_many(ctx, mixed_k, x.data(), 2, two_y), Error);
  // The pool still works after the rejected calls.
  std::vector<float> a(2 * 16), b(2 * 16);
  float* const ya[] = {a.data()};
  matmul_many(ctx, std::span<const WeightView>(&w, 1), x.data(), 2, ya);
  matmul(Context{nullptr, CpuPath::Reference, MatmulMode::Int8}, w, x.data(), 2, b.data());
  EXPECT_TRUE(same_bits(a.data(), b.data(), 2 * 16));
}

INSTANTIATE_TEST_SUITE_P(Weights, MatmulManyTest, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace ferry::kernels
