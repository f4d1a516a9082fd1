// Checks every kernel of src/cuda/cuda_ops.h against ferry's CPU kernels (the
// reference path), and the GPU's batch invariance directly. Needs a GPU
// (skipped without one); run by tools/cuda/test.sh, not by ctest.
//
// Tolerances, where results are not exact:
// - dot products (matmul, attention scores, rmsnorm's sum of squares) are
//   summed in a different order than the CPU's 16-lane order: each output
//   may differ by a few float ulps of sum |terms|, so we allow
//   2e-5 * sum|w_k x_k| (n_in up to 4096: the typical error is about
//   sqrt(n) * 2^-24 = 4e-6 of that sum, the bound is loose on purpose);
// - expf, cosf and sinf are CUDA's (within 2 ulp), the CPU's are glibc's.
// Exact (bit for bit): embed, dequantize_bf16, f32_to_bf16, add_inplace,
// kv_store's bytes, and any row of matmul/attention alone vs in a batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "cuda/cuda_internal.h"
#include "cuda/fp8.h"
#include "cuda_test_util.h"
#include "kernels/kernel_test_util.h"
#include "kernels/quant_blocks.h"

namespace ferry::test {
namespace {

using kernels::KvFormat;

std::string name(DType t) {
  return std::string(dtype_traits(t).name);
}

bool is_dense(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

// Host-decoded weights [n_out, n_in] (the oracle's decoder).
std::vector<float> decode_host(DType t, const std::vector<uint8_t>& w, size_t n_in, size_t n_out) {
  std::vector<float> f(n_in * n_out);
  const size_t rb = row_bytes(t, n_in);
  for (size_t j = 0; j < n_out; ++j)
    kernels::decode_row(t, w.data() + j * rb, f.data() + j * n_in, n_in);
  return f;
}

// n_in values per type worth testing: whole stages, partial stages, and rows
// that are not 16-byte multiples (the 2-byte staging path).
std::vector<size_t> n_in_cases(DType t) {
  if (dtype_traits(t).block_elems == 256) return {256, 1536, 4096};
  if (is_dense(t)) return {64, 80, 1040, 4096};
  return {64, 96, 4160, 4096};
}

// ---- embed, dequantize_bf16 -------------------------------------------------

TEST(CudaOps, EmbedIsExact) {
  REQUIRE_GPU();
  for (DType t : kAllTypes)
    for (size_t n_in : n_in_cases(t)) {
      const size_t vocab = 50;
      const auto table = random_weights(t, n_in, vocab, 11);
      const std::vector<int32_t> tokens = {3, 0, 49, 3, 17, 25, 8};
      std::vector<float> want(tokens.size() * n_in);
      kernels::embed({t, table.data(), n_in, vocab}, tokens, want.data());
      DeviceBuffer<uint8_t> d_table(table);
      DeviceBuffer<int32_t> d_tok(tokens);
      DeviceBuffer<float> d_out(want.size());
      d_out.poison();
      cuda::embed(d_table.get(), t, n_in, d_tok.get(), tokens.size(), d_out.get(), nullptr);
      const auto got = d_out.download();
      EXPECT_EQ(first_bit_diff(want, got.data(), want.size()), -1) << name(t) << " n_in=" << n_in;
    }
}

TEST(CudaOps, DequantizeBf16IsExact) {
  REQUIRE_GPU();
  for (DType t : kAllTypes)
    for (size_t n_in : n_in_cases(t)) {
      const size_t n_out = 13;
      const auto w = random_weights(t, n_in, n_out, 12);
      const auto f = decode_host(t, w, n_in, n_out);
      DeviceBuffer<uint8_t> d_w(w);
      DeviceBuffer<uint16_t> d_out(f.size());
      d_out.poison();
      cuda::dequantize_bf16(d_w.get(), t, n_in, n_out, d_out.get(), nullptr);
      const auto got = d_out.download();
      size_t bad = 0;
      for (size_t i = 0; i < f.size(); ++i) bad += got[i] != f32_to_bf16(f[i]);
      EXPECT_EQ(bad, 0u) << name(t) << " n_in=" << n_in;
    }
}

// ---- elementwise --------------------------------------------------------------

TEST(CudaOps, F32ToBf16AndAddAreExact) {
  REQUIRE_GPU();
  auto x = random_floats(10007, 21, 3.0f);
  // Ties (round to even both ways), inf, NaN, a subnormal.
  const uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0x7f800000u,
                               0xff800000u, 0x7fc00001u, 0x00000123u};
  for (size_t i = 0; i < std::size(specials); ++i) std::memcpy(&x[i], &specials[i], 4);
  DeviceBuffer<float> d_x(x);
  DeviceBuffer<uint16_t> d_bf(x.size());
  d_bf.poison();
  cuda::f32_to_bf16(d_x.get(), x.size(), d_bf.get(), nullptr);
  const auto bf = d_bf.download();
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(bf[i], f32_to_bf16(x[i])) << i;

  auto a = random_floats(10007, 22), b = random_floats(10007, 23);
  DeviceBuffer<float> d_a(a), d_b(b);
  cuda::add_inplace(d_a.get(), d_b.get(), a.size(), nullptr);
  kernels::add_inplace(a.data(), b.data(), a.size());
  const auto got = d_a.download();
  EXPECT_EQ(first_bit_diff(a, got.data(), a.size()), -1);
}

// select_logits gives model::select_from_row's ids and values exactly, for
// every top_n (1, the argmax path; more, the radix select) on rows with
// heavy ties, -0, NaN and -inf, vocabularies that do and do not fill the
// block, and rows asking nothing; the log-sum-exp's max exactly and its sum
// to 1e-12 relative (double sums in another order).
TEST(CudaOps, SelectLogitsMatchesTheReference) {
  REQUIRE_GPU();
  for (size_t vocab : {7u, 1000u, 128256u}) {
    const std::vector<uint32_t> top_ns = {1, 2, 5, 40, 1000, model::kMaxTopN, 0, 3};
    const size_t rows = top_ns.size() + 1;
    std::mt19937 gen(static_cast<uint32_t>(vocab));
    std::vector<float> logits(rows * vocab);
    for (size_t r = 0; r < rows; ++r)
      for (size_t i = 0; i < vocab; ++i) {
        const uint32_t k = gen() % 64;
        float v = static_cast<float>(static_cast<int>(gen() % 2001) - 1000) / 64.0f;
        if (r % 3 == 0) v = std::round(v);  // many ties
        if (k == 0) v = NAN;
        if (k == 1) v = -0.0f;
        if (k == 2) v = -INFINITY;
        logits[r * vocab + i] = v;
      }
    std::vector<cuda::SelectJob> jobs(rows);
    for (size_t r = 0; r < top_ns.size(); ++r) jobs[r] = {top_ns[r], r % 2 == 0 ? 1u : 0u};
    jobs[rows - 1] = {0, 1};  // lse only
    const size_t stride = model::kMaxTopN;
    DeviceBuffer<float> d_logits(logits);
    DeviceBuffer<cuda::SelectJob> d_jobs(jobs);
    DeviceBuffer<model::TopLogit> d_top(rows * stride);
    DeviceBuffer<uint32_t> d_count(rows);
    DeviceBuffer<float> d_max(rows);
    DeviceBuffer<double> d_sum(rows);
    d_top.poison();
    d_count.poison();
    cuda::select_logits(d_logits.get(), rows, vocab, d_jobs.get(), stride, d_top.get(),
                        d_count.get(), d_max.get(), d_sum.get(), nullptr);
    const auto top = d_top.download();
    const auto count = d_count.download();
    const auto mx = d_max.download();
    const auto sum = d_sum.download();
    for (size_t r = 0; r < rows; ++r) {
      std::vector<model::TopLogit> want;
      model::LogSumExp lse;
      const std::span<const float> row(&logits[r * vocab], vocab);
      model::select_from_row(row, jobs[r].top_n, want, &lse);
      const std::string what = "vocab " + std::to_string(vocab) + " row " + std::to_string(r);
      if (jobs[r].top_n > 0) {
        ASSERT_EQ(count[r], want.size()) << what;
        for (size_t i = 0; i < want.size(); ++i) {
          const model::TopLogit g = top[r * stride + i];
          ASSERT_EQ(g.id, want[i].id) << what << " rank " << i;
          ASSERT_EQ(std::memcmp(&g.value, &want[i].value, 4), 0) << what << " rank " << i;
        }
      }
      if (jobs[r].lse) {
        EXPECT_EQ(mx[r], lse.max) << what;
        EXPECT_NEAR(sum[r], lse.sum, 1e-12 * lse.sum) << what;
      }
    }
  }
}

// draw_logits draws model::draw_from_row's token (id and raw logit, bit for
// bit) on rows with heavy ties, -0, NaN and -inf, over temperatures, top-k
// (off, 1, a few, past the row), top-p and min-p and uniforms at both ends;
// rows not asked are left as they were; an all-NaN row draws id -1; rows
// with penalties draw from the penalised row and give the raw logit; with
// every number of blocks per row (1 to 8: clusters on Hopper).
TEST(CudaOps, DrawLogitsMatchesTheReference) {
  REQUIRE_GPU();
  for (size_t vocab : {7u, 1000u, 128256u}) {
    std::mt19937 gen(static_cast<uint32_t>(vocab) + 5);
    std::uniform_real_distribution<double> uni(0.0, 1.0);
    std::vector<cuda::DrawJob> jobs;
    const float temps[] = {0.2f, 0.7f, 1.0f, 2.0f};
    const uint32_t ks[] = {0, 1, 4, 50, 1u << 20};
    const float ps[] = {1.0f, 0.95f, 0.5f};
    const float min_ps[] = {0.0f, 0.1f};
    for (float t : temps)
      for (uint32_t k : ks)
        for (float p : ps)
          for (float mp : min_ps) {
            cuda::DrawJob j;
            j.spec.inv_temp = 1.0f / t;
            j.spec.top_k = k;
            j.spec.top_p = p;
            j.spec.log_min_p = mp > 0 ? std::log(mp) : -INFINITY;
            const size_t n = jobs.size();
            j.spec.u = n % 17 == 0 ? 0.0 : (n % 17 == 1 ? std::nextafter(1.0, 0.0) : uni(gen));
            j.active = n % 23 == 5 ? 0u : 1u;
            jobs.push_back(j);
          }
    const size_t rows = jobs.size();
    std::vector<float> logits(rows * vocab);
    for (size_t r = 0; r < rows; ++r)
      for (size_t i = 0; i < vocab; ++i) {
        const uint32_t k = gen() % 64;
        float v = static_cast<float>(static_cast<int>(gen() % 2001) - 1000) / 64.0f;
        if (r % 3 == 0) v = std::round(v / 4);  // many ties
        if (k == 0) v = NAN;
        if (k == 1) v = -0.0f;
        if (k == 2) v = -INFINITY;
        logits[r * vocab + i] = v;
      }
    for (size_t i = 0; i < vocab; ++i) logits[(rows - 1) * vocab + i] = NAN;
    jobs[rows - 1].active = 1;
    // Every third row penalised: 1 to 300 tokens (one outside the
    // vocabulary), repetition 1.3 or 1, subtractions of 0 to 2.
    std::vector<model::DrawPenalty> pens;
    for (size_t r = 0; r + 1 < rows; r += 3) {
      jobs[r].pen_begin = static_cast<uint32_t>(pens.size());
      const size_t n = 1 + gen() % 300;
      std::vector<int32_t> tokens;
      for (size_t k = 0; k < n; ++k) tokens.push_back(static_cast<int32_t>(gen() % vocab));
      tokens.push_back(static_cast<int32_t>(vocab) + 3);
      std::sort(tokens.begin(), tokens.end());
      tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
      for (int32_t t : tokens)
        pens.push_back({t, (gen() % 3 == 0) ? 0.0f : static_cast<float>(gen() % 9) * 0.25f});
      jobs[r].pen_count = static_cast<uint32_t>(pens.size()) - jobs[r].pen_begin;
      jobs[r].spec.repetition = r % 2 ? 1.0f : 1.3f;
    }
    DeviceBuffer<cuda::DrawJob> d_jobs(jobs);
    DeviceBuffer<model::DrawPenalty> d_pens(pens);
    DeviceBuffer<float> d_raw(pens.size());
    DeviceBuffer<model::TopLogit> d_out(rows);
    for (const char* blocks : {"0", "1", "2", "4", "8"})  // per row; 0: as chosen
    {
      setenv("FERRY_CUDA_DRAW_CLUSTER", blocks, 1);
      d_out.poison();
      DeviceBuffer<float> d_logits(logits);  // (penalised in place)
      cuda::draw_logits(d_logits.get(), rows, vocab, d_jobs.get(), d_pens.get(), d_raw.get(),
                        d_out.get(), nullptr);
      const auto out = d_out.download();
      for (size_t r = 0; r < rows; ++r) {
        const std::string what =
            "vocab " + std::to_string(vocab) + " row " + std::to_string(r) + " blocks " + blocks;
        if (!jobs[r].active) {
          model::TopLogit poisoned;
          std::memset(&poisoned, 0xff, sizeof(poisoned));
          EXPECT_EQ(std::memcmp(&out[r], &poisoned, sizeof(poisoned)), 0) << what;
          continue;
        }
        std::vector<float> row(&logits[r * vocab], &logits[(r + 1) * vocab]);
        model::apply_draw_penalties(row, jobs[r].spec.repetition,
                                    std::span<const model::DrawPenalty>(pens).subspan(
                                        jobs[r].pen_begin, jobs[r].pen_count));
        const model::TopLogit want = model::draw_from_row(row, jobs[r].spec);
        ASSERT_EQ(out[r].id, want.id) << what;
        if (want.id >= 0) {  // the raw logit
          ASSERT_EQ(
              std::memcmp(&out[r].value, &logits[r * vocab + static_cast<size_t>(want.id)], 4), 0)
              << what;
        }
      }
      EXPECT_EQ(out[rows - 1].id, -1);
    }
  }
  unsetenv("FERRY_CUDA_DRAW_CLUSTER");
}

TEST(CudaOps, SiluMulMatchesCpu) {
  REQUIRE_GPU();
  auto g = random_floats(5003, 31, 8.0f), u = random_floats(5003, 32, 2.0f);
  DeviceBuffer<float> d_g(g), d_u(u);
  cuda::silu_mul(d_g.get(), d_u.get(), g.size(), nullptr);
  kernels::silu_mul(kernels::Context{}, g.data(), u.data(), g.size());
  const auto got = d_g.download();
  // expf and the CPU's canonical exponential each within 2 ulp of e^-g,
  // then a divide and a multiply: a few ulp of the result.
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(got[i], g[i], 1e-6f * std::fabs(g[i]) + 1e-30f) << i;
}

TEST(CudaOps, RmsnormMatchesCpu) {
  REQUIRE_GPU();
  // Rows kept in registers (up to 8192) and longer ones; 16-byte loads, and
  // scalar ones when a row is not 16-byte aligned (x one float in).
  for (size_t dim : {64, 576, 4096, 5120, 8208, 9008}) {
    const size_t rows = 9;
    const auto x = random_floats(rows * dim, 41, 2.0f), w = random_floats(dim, 42);
    std::vector<float> want(x.size());
    kernels::rmsnorm({}, x.data(), w.data(), rows, dim, 1e-5f, want.data());
    DeviceBuffer<float> d_x(x), d_w(w), d_out(x.size());
    d_out.poison();
    cuda::rmsnorm(d_x.get(), d_w.get(), rows, dim, 1e-5f, d_out.get(), nullptr);
    const auto got = d_out.download();
    {
      std::vector<float> shifted(x.size() + 1);
      std::copy(x.begin(), x.end(), shifted.begin() + 1);
      DeviceBuffer<float> d_s(shifted), d_so(x.size() + 1);
      cuda::rmsnorm(d_s.get() + 1, d_w.get(), rows, dim, 1e-5f, d_so.get() + 1, nullptr);
      const auto so = d_so.download();
      EXPECT_EQ(first_bit_diff(got, so.data() + 1, x.size()), -1) << "unaligned, dim=" << dim;
    }
    // The sum of squares (positive terms) is within ~1e-6 relative of the
    // CPU's; the scale's sqrt halves that; the products round once each.
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 2e-6f * std::fabs(want[i]) + 1e-30f) << i << " dim=" << dim;
    // In place (out aliases x) gives the same bits; row 4 alone as well.
    cuda::rmsnorm(d_x.get(), d_w.get(), rows, dim, 1e-5f, d_x.get(), nullptr);
    EXPECT_EQ(first_bit_diff(got, d_x.download().data(), x.size()), -1);
    DeviceBuffer<float> d_row(std::vector<float>(x.begin() + 4 * dim, x.begin() + 5 * dim)),
        d_one(dim);
    cuda::rmsnorm(d_row.get(), d_w.get(), 1, dim, 1e-5f, d_one.get(), nullptr);
    const auto one = d_one.download();
    EXPECT_EQ(first_bit_diff(one, got.data() + 4 * dim, dim), -1) << "dim=" << dim;
  }
}

// The fused forms the backend uses: add_rmsnorm is add_inplace then
// rmsnorm, bit for bit, and the bf16 copies written by rmsnorm and silu_mul
// are f32_to_bf16 of their f32 outputs.
TEST(CudaOps, FusedNormAndBf16CopiesEqualSeparateOps) {
  REQUIRE_GPU();
  const size_t rows = 5, dim = 4096;
  const auto x = random_floats(rows * dim, 43, 2.0f), y = random_floats(rows * dim, 44, 2.0f),
             w = random_floats(dim, 45);
  auto bf16_of = [](const DeviceBuffer<float>& f, size_t n) {
    DeviceBuffer<uint16_t> b(n);
    cuda::f32_to_bf16(f.get(), n, b.get(), nullptr);
    return b.download();
  };
  // Separate ops.
  DeviceBuffer<float> d_x(x), d_y(y), d_w(w), d_out(x.size());
  cuda::add_inplace(d_x.get(), d_y.get(), x.size(), nullptr);
  cuda::rmsnorm(d_x.get(), d_w.get(), rows, dim, 1e-5f, d_out.get(), nullptr);
  const auto sum = d_x.download(), norm = d_out.download();
  const auto norm_bf16 = bf16_of(d_out, x.size());
  // Fused.
  DeviceBuffer<float> f_x(x), f_out(x.size());
  DeviceBuffer<uint16_t> f_b(x.size());
  f_out.poison();
  cuda::add_rmsnorm(f_x.get(), d_y.get(), d_w.get(), rows, dim, 1e-5f, f_out.get(), f_b.get(),
                    nullptr);
  EXPECT_EQ(first_bit_diff(sum, f_x.download().data(), x.size()), -1) << "x + y";
  EXPECT_EQ(first_bit_diff(norm, f_out.download().data(), x.size()), -1) << "norm";
  EXPECT_TRUE(f_b.download() == norm_bf16) << "add_rmsnorm's bf16 copy";
  // rmsnorm's own copy.
  DeviceBuffer<uint16_t> r_b(x.size());
  cuda::rmsnorm(d_x.get(), d_w.get(), rows, dim, 1e-5f, d_out.get(), nullptr, r_b.get());
  EXPECT_TRUE(r_b.download() == norm_bf16) << "rmsnorm's bf16 copy";
  // silu_mul's.
  DeviceBuffer<float> g(x), u(y);
  DeviceBuffer<uint16_t> g_b(x.size());
  cuda::silu_mul(g.get(), u.get(), x.size(), nullptr, g_b.get());
  EXPECT_TRUE(g_b.download() == bf16_of(g, x.size())) << "silu_mul's bf16 copy";
}

// The FP8 codes a norm writes for the next FP8 product (--fp8): exactly
// quantize_fp8_rows of the norm's f32 output, for rows held in registers
// with 16-byte pieces (4096) and without (4,098: 4-byte aligned codes,
// pieces of 4 with a short last one), and for rows too long for registers
// (8,208: the codes from a quantize_fp8_rows launch after the norm), with
// and without the residual add; one row all zeros (scale 1, codes 0).
TEST(CudaOps, NormFp8CodesEqualQuantizedOutput) {
  REQUIRE_GPU();
  const size_t rows = 9;
  for (const size_t dim : {size_t{4096}, size_t{4098}, size_t{8208}})
    for (const bool add : {false, true}) {
      auto x = random_floats(rows * dim, 61, 2.0f), y = random_floats(rows * dim, 62, 2.0f);
      std::fill(x.begin() + 3 * dim, x.begin() + 4 * dim, 0.0f);
      std::fill(y.begin() + 3 * dim, y.begin() + 4 * dim, 0.0f);
      const auto w = random_floats(dim, 63);
      DeviceBuffer<float> d_x(x), d_y(y), d_w(w), d_out(x.size());
      DeviceBuffer<uint8_t> codes(rows * dim), want(rows * dim);
      DeviceBuffer<float> scales(rows), want_scales(rows);
      codes.poison();
      scales.poison();
      const cuda::Fp8RowsOut out8{codes.get(), scales.get()};
      if (add) {
        cuda::add_rmsnorm(d_x.get(), d_y.get(), d_w.get(), rows, dim, 1e-5f, d_out.get(), nullptr,
                          nullptr, out8);
      } else {
        cuda::rmsnorm(d_x.get(), d_w.get(), rows, dim, 1e-5f, d_out.get(), nullptr, nullptr, out8);
      }
      cuda::quantize_fp8_rows(d_out.get(), DType::F32, rows, dim, want.get(), want_scales.get(),
                              nullptr);
      EXPECT_TRUE(codes.download() == want.download()) << "dim " << dim << (add ? " add" : "");
      const auto got_s = scales.download();
      EXPECT_EQ(first_bit_diff(want_scales.download(), got_s.data(), rows), -1)
          << "dim " << dim << (add ? " add" : "");
      EXPECT_EQ(got_s[3], 1.0f) << "the zero row's scale";
    }
}

TEST(CudaOps, RopeMatchesCpu) {
  REQUIRE_GPU();
  // (13 + 2 heads: q's heads cross the kernel's runs of 8.)
  for (size_t heads : {5, 13})
    for (size_t head_dim : {64, 128}) {
      const size_t rows = 7;
      auto x = random_floats(rows * heads * head_dim, 51);
      std::vector<float> inv(head_dim / 2);
      for (size_t i = 0; i < inv.size(); ++i) inv[i] = std::pow(500000.0f, -2.0f * i / head_dim);
      const std::vector<int32_t> pos = {0, 1, 17, 300, 4095, 8191, 131000};
      DeviceBuffer<float> d_x(x), d_inv(inv);
      DeviceBuffer<int32_t> d_pos(pos);
      // rope2 (q and k in one launch) gives each tensor the bits of its own call.
      auto y = random_floats(rows * 2 * head_dim, 52);
      DeviceBuffer<float> d_y(y), d_x2(x), d_y2(y);
      cuda::rope2(d_x2.get(), heads, d_y2.get(), 2, rows, head_dim, d_pos.get(), d_inv.get(),
                  nullptr);
      cuda::rope(d_x.get(), rows, heads, head_dim, d_pos.get(), d_inv.get(), nullptr);
      cuda::rope(d_y.get(), rows, 2, head_dim, d_pos.get(), d_inv.get(), nullptr);
      EXPECT_EQ(first_bit_diff(d_x.download(), d_x2.download().data(), x.size()), -1);
      EXPECT_EQ(first_bit_diff(d_y.download(), d_y2.download().data(), y.size()), -1);
      for (size_t r = 0; r < rows; ++r)
        kernels::rope(x.data() + r * heads * head_dim, heads, head_dim, pos[r], inv.data());
      const auto got = d_x.download();
      // cosf/sinf within 2 ulp of glibc's (the angle itself is bit-identical):
      // |error| <= ~4 ulp of 1 for inputs in [-1, 1].
      for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(got[i], x[i], 1e-6f) << i;
    }
}

// ---- matmul_gguf ---------------------------------------------------------------

// GPU y for x [n_rows, n_in] (device weights given).
std::vector<float> gpu_matmul(const DeviceBuffer<uint8_t>& w, DType t, size_t n_in, size_t n_out,
                              const std::vector<float>& x, size_t n_rows) {
  DeviceBuffer<float> d_x(x), d_y(n_rows * n_out);
  d_y.poison();
  cuda::matmul_gguf(w.get(), t, n_in, n_out, d_x.get(), n_rows, d_y.get(), nullptr);
  return d_y.download();
}

TEST(CudaOps, MatmulGgufMatchesCpuForAllTypesAndRowCounts) {
  REQUIRE_GPU();
  for (DType t : kAllTypes)
    for (size_t n_in : n_in_cases(t)) {
      const size_t n_out = 37;  // not a multiple of the 4 columns of a block
      const auto w = random_weights(t, n_in, n_out, 61);
      const auto wf = decode_host(t, w, n_in, n_out);
      DeviceBuffer<uint8_t> d_w(w);
      const size_t row_counts[] = {1, 2, 7, 8, 9, 64, 300};
      for (size_t n_rows : row_counts) {
        if (n_in == 4096 && n_rows == 300 && !(t == DType::Q4_K || t == DType::F16))
          continue;  // CPU time
        const auto x = random_floats(n_rows * n_in, 62 + n_rows);
        std::vector<float> want(n_rows * n_out);
        kernels::matmul({}, {t, w.data(), n_in, n_out}, x.data(), n_rows, want.data());
        const auto got = gpu_matmul(d_w, t, n_in, n_out, x, n_rows);
        for (size_t r = 0; r < n_rows; ++r)
          for (size_t j = 0; j < n_out; ++j) {
            double mag = 0;
            for (size_t k = 0; k < n_in; ++k)
              mag += std::fabs(double{wf[j * n_in + k]} * x[r * n_in + k]);
            ASSERT_NEAR(got[r * n_out + j], want[r * n_out + j], 2e-5 * mag + 1e-30)
                << name(t) << " n_in=" << n_in << " rows=" << n_rows << " r=" << r << " j=" << j;
          }
        // Every row of the batch equals that row computed alone, bit for bit.
        if (n_rows <= 64)
          for (size_t r = 0; r < n_rows; ++r) {
            const std::vector<float> xr(x.begin() + r * n_in, x.begin() + (r + 1) * n_in);
            const auto one = gpu_matmul(d_w, t, n_in, n_out, xr, 1);
            ASSERT_EQ(first_bit_diff(one, got.data() + r * n_out, n_out), -1)
                << name(t) << " n_in=" << n_in << " rows=" << n_rows << " r=" << r;
          }
      }
    }
}

TEST(CudaOps, MatmulGgufRowIsBatchInvariant) {
  REQUIRE_GPU();
  for (DType t : kAllTypes) {
    const size_t n_in = 4096, n_out = 300;
    const auto w = random_weights(t, n_in, n_out, 71);
    DeviceBuffer<uint8_t> d_w(w);
    const auto x0 = random_floats(n_in, 72);
    const auto alone = gpu_matmul(d_w, t, n_in, n_out, x0, 1);
    // 1 and 2 rows stage x in shared memory, more read it from L1/L2.
    for (size_t batch : {2, 3, 8, 37})
      for (size_t at : {size_t{0}, batch / 2, batch - 1}) {
        auto x = random_floats(batch * n_in, 73 + batch);
        std::copy(x0.begin(), x0.end(), x.begin() + at * n_in);
        const auto got = gpu_matmul(d_w, t, n_in, n_out, x, batch);
        ASSERT_EQ(first_bit_diff(alone, got.data() + at * n_out, n_out), -1)
            << name(t) << " batch=" << batch << " at=" << at;
      }
  }
}

// ---- kv_store ----------------------------------------------------------------

// (Every affine family: kv_store compiles one quantizer per bits and group.)
const KvFormat kKvFormats[] = {
    KvFormat::f32(),          KvFormat::f16(),         KvFormat::bf16(),
    KvFormat::affine(8, 32),  KvFormat::affine(4, 64), KvFormat::affine(4, 32),
    KvFormat::affine(8, 128), KvFormat::affine(8, 64), KvFormat::affine(4, 128)};

// Token rows with the affine codec's edge cases mixed in: a constant group, a
// zero group, a group whose edge is its (negative) minimum, tiny values.
std::vector<float> kv_rows(size_t n_tokens, size_t kv_dim, uint32_t seed) {
  auto x = random_floats(n_tokens * kv_dim, seed, 2.0f);
  for (size_t i = 0; i < 32; ++i) {
    x[i] = 0.75f;                   // constant
    x[32 + i] = 0.0f;               // zeros
    x[64 + i] = -3.0f + 0.01f * i;  // negative edge
    x[96 + i] = 1e-6f * (i % 5);    // tiny (scale clamps to 1e-7)
  }
  // Then a group whose maximum is a zero of both signs (the CPU's scan
  // keeps the first) and NaNs, which the scan skips. (Not infinities: a
  // group holding one gets a NaN scale whose sign bit is the platform's
  // default NaN, set by the x86 divider on the CPU and positive on the GPU.)
  for (size_t i = 0; i < 64; ++i) x[128 + i] = i % 3 == 0 ? -0.0f : i % 3 == 1 ? 0.0f : -0.25f * i;
  x[128 + 40] = std::nanf("");
  x[128 + 5] = -std::numeric_limits<float>::quiet_NaN();
  return x;
}

// 5 writes (a decode-sized call: a block per write) and 70 (a prefill-sized
// one: 8 writes a block, the last block ragged).
TEST(CudaOps, KvStoreBytesEqualCpuEncoding) {
  REQUIRE_GPU();
  for (size_t n_tokens : {5, 70})
    for (size_t D : {64, 128})
      for (const KvFormat& kf : kKvFormats)
        for (const KvFormat& vf : {KvFormat::affine(4, 64), KvFormat::f16(), kf}) {
          if (!(D % std::max<size_t>(kf.group, 1) == 0 && D % std::max<size_t>(vf.group, 1) == 0))
            continue;
          const size_t H = 2, C = n_tokens == 5 ? 40 : 80;
          KvPlanes K(kf, D, H, C, 0xab), V(vf, D, H, C, 0xcd);
          K.upload();
          V.upload();
          const auto k = kv_rows(n_tokens, H * D, 81), v = kv_rows(n_tokens, H * D, 82);
          std::vector<cuda::KvWrite> writes;
          const uint32_t slots[] = {0, 39, 7, 8, 20};
          for (uint32_t i = 0; i < n_tokens; ++i) {
            cuda::KvWrite w;
            w.k = K.side(true);
            w.v = V.side(true);
            w.slot = n_tokens == 5 ? slots[i] : (i * 37 + 3) % 80;  // distinct slots
            w.token = (i * 3) % n_tokens;
            writes.push_back(w);
            for (size_t h = 0; h < H; ++h) {
              K.encode(h, w.slot, k.data() + (w.token * H + h) * D);
              V.encode(h, w.slot, v.data() + (w.token * H + h) * D);
            }
          }
          DeviceBuffer<float> d_k(k), d_v(v);
          DeviceBuffer<cuda::KvWrite> d_writes(writes.size());
          CK(cudaMemcpy(d_writes.get(), writes.data(), writes.size() * sizeof(cuda::KvWrite),
                        cudaMemcpyHostToDevice));
          cuda::kv_store(d_writes.get(), writes.size(), H, D, d_k.get(), d_v.get(), nullptr);
          for (size_t p = 0; p < K.units.size(); ++p)
            EXPECT_TRUE(K.download(p) == K.host[p])
                << "K " << kf.name() << " plane " << p << " D=" << D << " tokens=" << n_tokens;
          for (size_t p = 0; p < V.units.size(); ++p)
            EXPECT_TRUE(V.download(p) == V.host[p])
                << "V " << vf.name() << " plane " << p << " D=" << D << " tokens=" << n_tokens;
        }
}

// kv_copy refuses a list it cannot index (before touching the device); an
// empty list is nothing to do.
TEST(CudaOps, KvCopyRejectsTooManyCopies) {
  REQUIRE_GPU();
  EXPECT_THROW(cuda::kv_copy(nullptr, size_t{1} << 32, 1, nullptr), Error);
  cuda::kv_copy(nullptr, 0, 1, nullptr);
  cuda::kv_copy(nullptr, 5, 0, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// ---- attention -----------------------------------------------------------------

struct AttnCase {
  size_t D, n_heads, n_kv_heads;
  KvFormat kf, vf;
};

// A cache of C slots filled with random K/V (encoded on the host), and jobs
// whose key ranges are given as (begin, end) pairs (two segments = wrap).
struct AttnFixture {
  AttnCase c;
  size_t C;
  KvPlanes K, V;
  AttnFixture(const AttnCase& ac, size_t slots, uint32_t seed)
      : c(ac),
        C(slots),
        K(ac.kf, ac.D, ac.n_kv_heads, slots, 0),
        V(ac.vf, ac.D, ac.n_kv_heads, slots, 0) {
    const auto k = random_floats(C * c.n_kv_heads * c.D, seed),
               v = random_floats(C * c.n_kv_heads * c.D, seed + 1);
    for (size_t h = 0; h < c.n_kv_heads; ++h)
      for (size_t j = 0; j < C; ++j) {
        K.encode(h, j, k.data() + (h * C + j) * c.D);
        V.encode(h, j, v.data() + (h * C + j) * c.D);
      }
    K.upload();
    V.upload();
  }
  kernels::AttentionShape shape() const {
    return {c.n_heads, c.n_kv_heads, c.D, 1.0f / std::sqrt(static_cast<float>(c.D))};
  }
};

struct JobSpec {
  kernels::KeySegment seg[2];
  uint32_t q_seed;
};

// Runs jobs on the GPU; returns out [n_jobs, n_heads, D]. Even jobs also
// ask for the output's bf16 copy, checked against f32_to_bf16 of out.
// k and v: other device planes of the fixture's cache (its own when null).
// settled: the jobs call some of their keys settled (AttentionJob::settled,
// from none to all of them) and the call says its list is
// (AttentionFormats::jobs_settled), so kernels stage them before their wait;
// query_settled: and fold them there (AttentionFormats::query_settled).
std::vector<float> gpu_attention(const AttnFixture& f, const std::vector<JobSpec>& specs,
                                 const std::vector<float>& q,
                                 cuda::AttentionVariant variant = cuda::AttentionVariant::Auto,
                                 const kernels::KvSide* k = nullptr,
                                 const kernels::KvSide* v = nullptr, bool settled = false,
                                 bool query_settled = false) {
  const size_t per = f.c.n_heads * f.c.D;
  DeviceBuffer<float> d_q(q), d_out(specs.size() * per);
  DeviceBuffer<uint16_t> d_b(specs.size() * per);
  d_out.poison();
  CK(cudaMemset(d_b.get(), 0x5a, specs.size() * per * 2));
  std::vector<cuda::AttentionJob> jobs(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    jobs[i].q = d_q.get() + i * per;
    jobs[i].out = d_out.get() + i * per;
    jobs[i].out_bf16 = i % 2 == 0 ? d_b.get() + i * per : nullptr;
    jobs[i].k = k ? *k : f.K.side(true);
    jobs[i].v = v ? *v : f.V.side(true);
    jobs[i].seg[0] = specs[i].seg[0];
    jobs[i].seg[1] = specs[i].seg[1];
    const size_t n = (specs[i].seg[0].end - specs[i].seg[0].begin) +
                     (specs[i].seg[1].end - specs[i].seg[1].begin);
    const size_t back[] = {1, 0, 33, n, 7};
    if (settled) jobs[i].settled = static_cast<uint32_t>(n - std::min(n, back[i % 5]));
  }
  DeviceBuffer<cuda::AttentionJob> d_jobs(jobs.size());
  CK(cudaMemcpy(d_jobs.get(), jobs.data(), jobs.size() * sizeof(cuda::AttentionJob),
                cudaMemcpyHostToDevice));
  // Workspace for the split variant, whatever the batch (Auto picks it for
  // fewer than kFewJobs jobs).
  DeviceBuffer<float> ws(specs.size() * cuda::attention_workspace_floats(1, f.shape()));
  cuda::AttentionFormats formats{f.c.kf, f.c.vf};
  formats.jobs_settled = settled;
  formats.query_settled = query_settled;
  cuda::attention_variant(d_jobs.get(), jobs.size(), f.shape(), formats, variant, ws.get(),
                          nullptr);
  const auto out = d_out.download();
  const auto bf = d_b.download();
  for (size_t i = 0; i < specs.size(); ++i)
    for (size_t e = 0; e < per; ++e) {
      const uint16_t want = i % 2 == 0 ? f32_to_bf16(out[i * per + e]) : uint16_t{0x5a5a};
      if (bf[i * per + e] != want) {
        ADD_FAILURE() << "bf16 copy of job " << i << " element " << e;
        return out;
      }
    }
  return out;
}

std::vector<float> queries(const AttnFixture& f, const std::vector<JobSpec>& specs) {
  const size_t per = f.c.n_heads * f.c.D;
  std::vector<float> q(specs.size() * per);
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto qi = random_floats(per, specs[i].q_seed, 2.0f);
    std::copy(qi.begin(), qi.end(), q.begin() + i * per);
  }
  return q;
}

std::vector<AttnCase> attn_cases() {
  std::vector<AttnCase> cases;
  const KvFormat formats[] = {KvFormat::f32(), KvFormat::f16(), KvFormat::bf16(),
                              KvFormat::affine(8, 32), KvFormat::affine(4, 64)};
  for (size_t D : {64, 128})
    for (const KvFormat& f : formats) {
      cases.push_back({D, 4, 4, f, f});  // GQA ratio 1
      cases.push_back({D, 8, 2, f, f});  // GQA ratio 4
    }
  cases.push_back(
      {128, 8, 2, KvFormat::affine(8, 32), KvFormat::affine(4, 64)});  // mixed K/V formats
  cases.push_back({256, 8, 1, KvFormat::f16(), KvFormat::f16()});      // D 256, GQA 8
  cases.push_back({80, 6, 2, KvFormat::bf16(), KvFormat::f32()});      // D 80, GQA 3
  return cases;
}

TEST(CudaOps, AttentionMatchesCpu) {
  REQUIRE_GPU();
  const size_t C = 700;
  for (const AttnCase& ac : attn_cases()) {
    AttnFixture f(ac, C, 91);
    const std::vector<JobSpec> specs = {
        {{{0, 1}, {0, 0}}, 1},      {{{3, 10}, {0, 0}}, 2},    {{{0, 32}, {0, 0}}, 3},
        {{{5, 38}, {0, 0}}, 4},     {{{100, 400}, {0, 0}}, 5}, {{{0, 700}, {0, 0}}, 6},
        {{{650, 700}, {0, 45}}, 7},  // a ring that wrapped: slots 650..699 then 0..44
        {{{690, 700}, {0, 300}}, 8}};
    const auto q = queries(f, specs);
    const auto got = gpu_attention(f, specs, q);
    const size_t per = ac.n_heads * ac.D;
    std::vector<float> want(specs.size() * per);
    const kernels::KvSide hk = f.K.side(false), hv = f.V.side(false);
    std::vector<kernels::AttentionTask> tasks(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      tasks[i].q = q.data() + i * per;
      tasks[i].out = want.data() + i * per;
      tasks[i].k = &hk;
      tasks[i].v = &hv;
      tasks[i].seg[0] = specs[i].seg[0];
      tasks[i].seg[1] = specs[i].seg[1];
    }
    kernels::attention({}, f.shape(), tasks);
    // Scores differ by a few ulps (summation order), exp by 2 ulp; outputs
    // are convex combinations of V values in [-1, 1] (decoded affine values a
    // little wider).
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 3e-5f)
          << "D=" << ac.D << " heads=" << ac.n_heads << "/" << ac.n_kv_heads
          << " K=" << ac.kf.name() << " V=" << ac.vf.name() << " job=" << i / per
          << " i=" << i % per;
  }
}

TEST(CudaOps, AttentionJobIsBatchInvariant) {
  REQUIRE_GPU();
  for (const AttnCase& ac :
       {AttnCase{128, 8, 2, KvFormat::f16(), KvFormat::f16()},
        AttnCase{64, 4, 4, KvFormat::affine(4, 64), KvFormat::affine(8, 32)}}) {
    AttnFixture f(ac, 1200, 101);
    const JobSpec target{{{1000, 1200}, {0, 333}}, 7};
    const size_t per = ac.n_heads * ac.D;
    const auto alone = gpu_attention(f, {target}, queries(f, {target}));
    std::mt19937 rng(5);
    for (size_t batch : {3, 8, 37})
      for (size_t at : {size_t{0}, batch / 2, batch - 1}) {
        std::vector<JobSpec> specs;
        for (size_t i = 0; i < batch; ++i) {
          const size_t b = rng() % 1100, e = b + 1 + rng() % (1200 - b - 1);
          specs.push_back({{{b, e}, {0, 0}}, static_cast<uint32_t>(200 + i)});
        }
        specs[at] = target;
        const auto got = gpu_attention(f, specs, queries(f, specs));
        ASSERT_EQ(first_bit_diff(alone, got.data() + at * per, per), -1)
            << "batch=" << batch << " at=" << at;
      }
  }
}

// The attention kernels (a block per job for decode steps, a warp per job
// for prefill steps, a block per (job, head, virtual warp) plus a merge for
// steps of few jobs) give the same bits for every job: keys from one tile
// to more than the 128 virtual warps' first round (up to 4,400 keys),
// wrapped segments, GQA groups of 1, 4 and 8, dense and affine K/V, in
// batches below and above the automatic switches; and batches of prompt
// chunks (runs of consecutive queries of one cache row, each seeing one key
// more than the one before, some wrapped and some past 4,096 keys), the
// job lists of prefill steps.
TEST(CudaOps, AttentionVariantsAreBitIdentical) {
  REQUIRE_GPU();
  for (const AttnCase& ac :
       {AttnCase{128, 32, 8, KvFormat::f16(), KvFormat::f16()},
        AttnCase{64, 8, 1, KvFormat::affine(4, 64), KvFormat::affine(8, 32)},
        AttnCase{128, 8, 2, KvFormat::bf16(), KvFormat::affine(4, 32)},
        AttnCase{64, 32, 2, KvFormat::f32(), KvFormat::bf16()},  // GQA 16: two chunks of 8
        // Tensor-core tiles (attention.cu, "tc"): GQA 8 (two warps' heads),
        // 1 and 2 (rows of absent heads), each affine family.
        AttnCase{128, 32, 4, KvFormat::bf16(), KvFormat::bf16()},
        AttnCase{64, 8, 8, KvFormat::affine(8, 64), KvFormat::affine(8, 64)},
        AttnCase{128, 16, 8, KvFormat::affine(4, 32), KvFormat::affine(4, 32)},
        AttnCase{128, 24, 8, KvFormat::affine(8, 32), KvFormat::affine(8, 32)},
        AttnCase{128, 32, 8, KvFormat::affine(4, 64), KvFormat::affine(4, 64)}}) {
    constexpr size_t C = 4400;
    AttnFixture f(ac, C, 77);
    std::mt19937 rng(11);
    for (size_t batch : {5, 40, 600, 601}) {
      std::vector<JobSpec> specs;
      if (batch == 601) {  // prompt chunks
        while (specs.size() < batch) {
          const size_t len = 1 + rng() % 50, kind = rng() % 4;
          for (size_t i = 0; i < len && specs.size() < batch; ++i) {
            const auto q_seed = static_cast<uint32_t>(specs.size());
            if (kind == 0)  // a wrapped row: slots 4000.. then 0..
              specs.push_back({{{4000, C}, {0, 10 + i}}, q_seed});
            else if (kind == 1)  // past the virtual warps' first round
              specs.push_back({{{0, 4150 + i}, {0, 0}}, q_seed});
            else
              specs.push_back({{{300, 301 + 37 * kind + i}, {0, 0}}, q_seed});
          }
        }
      }
      for (size_t i = 0; specs.size() < batch; ++i) {
        const size_t b = rng() % (i % 2 ? 300 : C - 100), e = b + 1 + rng() % (C - b - 1);
        if (i % 7 == 3)
          specs.push_back({{{b, C}, {0, 1 + rng() % 200}}, static_cast<uint32_t>(i)});
        else
          specs.push_back({{{b, i % 5 == 0 ? b + 1 : e}, {0, 0}}, static_cast<uint32_t>(i)});
      }
      const auto q = queries(f, specs);
      const auto a = gpu_attention(f, specs, q, cuda::AttentionVariant::PerBlock);
      const auto b = gpu_attention(f, specs, q, cuda::AttentionVariant::PerWarp);
      const auto c = gpu_attention(f, specs, q, cuda::AttentionVariant::Auto);
      const auto d = gpu_attention(f, specs, q, cuda::AttentionVariant::Split);
      const auto e = gpu_attention(f, specs, q, cuda::AttentionVariant::Shared);
      ASSERT_EQ(first_bit_diff(a, e.data(), a.size()), -1) << "shared, batch=" << batch;
      for (auto variant : {cuda::AttentionVariant::Split, cuda::AttentionVariant::Auto})
        for (bool fold : {false, true}) {
          const auto g = gpu_attention(f, specs, q, variant, nullptr, nullptr, true, fold);
          ASSERT_EQ(first_bit_diff(a, g.data(), a.size()), -1)
              << "settled keys, folded early: " << fold << ", batch=" << batch;
        }
      ASSERT_EQ(first_bit_diff(a, b.data(), a.size()), -1)
          << "D=" << ac.D << " heads=" << ac.n_heads << "/" << ac.n_kv_heads << " batch=" << batch;
      ASSERT_EQ(first_bit_diff(a, c.data(), a.size()), -1) << "batch=" << batch;
      ASSERT_EQ(first_bit_diff(a, d.data(), a.size()), -1) << "split, batch=" << batch;
    }
  }
}

// The shared-staging kernel (dense caches; affine ones run the per-warp
// kernel) stages a block's tiles for its longest job; a shorter job must
// not see the keys past its own, even where they hold inf and NaN: two
// prompt chunks of four queries, the last key of each chunk's longest job
// poisoned in K and V. The other jobs' outputs must be finite and the
// per-warp kernel's bits (its own staging leaves zeros past a job's keys).
TEST(CudaOps, AttentionSharedStagingHidesLongerJobsKeys) {
  REQUIRE_GPU();
  for (const KvFormat& kf : {KvFormat::bf16(), KvFormat::f16()}) {
    const AttnCase ac{128, 8, 2, kf, kf};
    AttnFixture f(ac, 200, 23);
    const bool bf = kf.kind == KvFormat::Kind::BF16;
    const uint16_t inf = bf ? 0x7f80 : 0x7c00, nan = bf ? 0x7fc0 : 0x7e00;
    for (size_t j : {35, 162})
      for (size_t h = 0; h < ac.n_kv_heads; ++h)
        for (KvPlanes* kv : {&f.K, &f.V})
          for (size_t i = 0; i < ac.D; ++i)
            std::memcpy(kv->at(0, h, j) + 2 * i, i % 2 ? &inf : &nan, 2);
    f.K.upload();
    f.V.upload();
    std::vector<JobSpec> specs;
    for (uint32_t i = 0; i < 4; ++i) specs.push_back({{{0, 33 + i}, {0, 0}}, i});
    for (uint32_t i = 0; i < 4; ++i) specs.push_back({{{100, 160 + i}, {0, 0}}, 4 + i});
    const auto q = queries(f, specs);
    const auto shared = gpu_attention(f, specs, q, cuda::AttentionVariant::Shared);
    const auto warp = gpu_attention(f, specs, q, cuda::AttentionVariant::PerWarp);
    const size_t per = ac.n_heads * ac.D;
    for (size_t j : {0, 1, 2, 4, 5, 6}) {
      for (size_t e = 0; e < per; ++e)
        ASSERT_TRUE(std::isfinite(shared[j * per + e])) << kf.name() << " job " << j;
      const std::vector<float> want(warp.begin() + j * per, warp.begin() + (j + 1) * per);
      ASSERT_EQ(first_bit_diff(want, shared.data() + j * per, per), -1)
          << kf.name() << " job " << j;
    }
    for (size_t j : {3, 7})  // the poison is there: the jobs that see it are not finite
      ASSERT_FALSE(std::all_of(shared.begin() + j * per, shared.begin() + (j + 1) * per,
                               [](float x) { return std::isfinite(x); }))
          << kf.name() << " job " << j;
  }
}

// The chain of a decode step, enqueued back to back on one stream so that
// attention's blocks start while the kernels before it still run: the
// Q/K/V product (100 MB of weights, tens of microseconds) writes q and,
// in its epilogue, the new token's K and V into their cache slot (a dense
// cache), or kv_store writes them after it (an affine one). Attention then
// calls every key but the new one settled, so it stages them (and, after
// kv_store, folds them with q) before its dependency wait. Its output must
// be the bits of the same attention run once the chain has finished: a
// read of the new token's tile, or of q, before the wait would see the
// slot's old bytes or q's. Repeated, since a race need not show at once.
// Needs the fused Q/K/V tile (Hopper).
TEST(CudaOps, EarlyAttentionWaitsForTheStepsWrites) {
  REQUIRE_GPU();
  constexpr size_t D = 128, H = 32, KVH = 8, n_in = 8192, C = 320, n = 200;
  if (!cuda::matmul_tc_qkv_rope_applies(n_in, (H + 2 * KVH) * D, 1))
    GTEST_SKIP() << "no fused Q/K/V tile on this GPU";
  const size_t n_out[3] = {H * D, KVH * D, KVH * D};
  // Weights: a random block of bf16 repeated (only their time matters).
  const std::vector<float> block = random_floats(1 << 20, 31, 0.02f);
  std::vector<std::unique_ptr<DeviceBuffer<uint16_t>>> w;
  for (size_t i = 0; i < 3; ++i) {
    std::vector<uint16_t> h(n_in * n_out[i]);
    for (size_t e = 0; e < h.size(); ++e) h[e] = f32_to_bf16(block[e % block.size()]);
    w.push_back(std::make_unique<DeviceBuffer<uint16_t>>(h));
  }
  const uint16_t* const wp[3] = {w[0]->get(), w[1]->get(), w[2]->get()};
  std::vector<uint16_t> xh(n_in);
  const auto xf = random_floats(n_in, 32);
  for (size_t e = 0; e < n_in; ++e) xh[e] = f32_to_bf16(xf[e]);
  DeviceBuffer<uint16_t> x(xh);
  DeviceBuffer<int32_t> pos(std::vector<int32_t>{static_cast<int32_t>(n - 1)});
  std::vector<float> inv(D / 2);
  for (size_t i = 0; i < D / 2; ++i)
    inv[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(D));
  DeviceBuffer<float> inv_freq(inv), yq(n_out[0]), yk(n_out[1]), yv(n_out[2]), out(H * D);
  float* const y[3] = {yq.get(), yk.get(), yv.get()};
  cudaStream_t stream = nullptr;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const KvFormat& f : {KvFormat::bf16(), KvFormat::affine(4, 64)}) {
    const bool dense = f.kind != KvFormat::Kind::Affine;
    AttnFixture fx({D, H, KVH, f, f}, C, 5);
    cuda::KvWrite wr;
    wr.k = fx.K.side(true);
    wr.v = fx.V.side(true);
    wr.slot = static_cast<uint32_t>(n - 1);
    wr.token = 0;
    DeviceBuffer<cuda::KvWrite> d_wr(std::vector<cuda::KvWrite>{wr});
    cuda::AttentionJob job;
    job.q = yq.get();
    job.out = out.get();
    job.k = wr.k;
    job.v = wr.v;
    job.seg[0] = {0, n};
    job.settled = static_cast<uint32_t>(n - 1);
    DeviceBuffer<cuda::AttentionJob> d_job(std::vector<cuda::AttentionJob>{job});
    DeviceBuffer<float> ws(cuda::attention_workspace_floats(1, fx.shape()));
    cuda::QkvEpilogue ep;
    ep.pos = pos.get();
    ep.inv_freq = inv_freq.get();
    ep.head_dim = D;
    if (dense) {
      ep.kv = f.kind;
      ep.writes = d_wr.get();
    }
    auto run = [&](bool early) {
      fx.K.upload();  // the new token's slot holds its old bytes again
      fx.V.upload();
      out.poison();
      CK(cudaDeviceSynchronize());
      cuda::matmul_tc_qkv_rope(wp, n_in, n_out, x.get(), 1, y, ep, stream);
      if (!dense) cuda::kv_store(d_wr.get(), 1, KVH, D, yk.get(), yv.get(), stream);
      if (!early) CK(cudaStreamSynchronize(stream));
      cuda::AttentionFormats formats{f, f};
      formats.jobs_settled = early;
      formats.query_settled = early && !dense;
      cuda::attention_variant(d_job.get(), 1, fx.shape(), formats, cuda::AttentionVariant::Split,
                              ws.get(), stream);
      CK(cudaStreamSynchronize(stream));
      return out.download();
    };
    const std::vector<float> want = run(false);
    for (int r = 0; r < 20; ++r) {
      const std::vector<float> got = run(true);
      ASSERT_EQ(first_bit_diff(want, got.data(), want.size()), -1) << f.name() << ", run " << r;
    }
  }
  CK(cudaStreamDestroy(stream));
}

// The tensor-core tiles split q (and p) exactly into three 16-bit parts;
// f16 K scales each head's q by a power of two into f16's range first.
// Queries of very large and very small magnitude (and one head of zeros)
// must still match the CPU's f32 attention, relative to their scores' size.
TEST(CudaOps, AttentionTensorCoreQueriesOfAnyScale) {
  REQUIRE_GPU();
  for (const KvFormat& kf : {KvFormat::f16(), KvFormat::bf16(), KvFormat::affine(4, 64)})
    for (float qs : {1e5f, 1e-6f}) {
      const AttnCase ac{128, 8, 2, kf, kf};
      AttnFixture f(ac, 300, 17);
      const std::vector<JobSpec> specs = {{{{0, 300}, {0, 0}}, 1}, {{{7, 40}, {0, 0}}, 2}};
      auto q = queries(f, specs);
      for (float& x : q) x *= qs;
      for (size_t i = 0; i < 128; ++i) q[3 * 128 + i] = 0.0f;  // job 0, head 3: zeros
      const auto got = gpu_attention(f, specs, q);
      const size_t per = ac.n_heads * ac.D;
      std::vector<float> want(specs.size() * per);
      const kernels::KvSide hk = f.K.side(false), hv = f.V.side(false);
      std::vector<kernels::AttentionTask> tasks(specs.size());
      for (size_t i = 0; i < specs.size(); ++i)
        tasks[i] = {q.data() + i * per,
                    want.data() + i * per,
                    &hk,
                    &hv,
                    {specs[i].seg[0], specs[i].seg[1]}};
      // Scores reach about qs * 2 * 128 / sqrt(128). At 1e5 (q past f16's
      // largest value, 65504) the softmax is nearly one-hot and a score's
      // rounding (f32: ~1e-7 of it, ~3e-3 here) moves weights by about that
      // much; at 1e-6 the weights are nearly uniform. Outputs are convex
      // combinations of values in [-1, 1].
      const float tol = qs > 1.0f ? 2e-2f : 3e-5f;
      kernels::attention({}, f.shape(), tasks);
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got[i], want[i], tol) << "K=" << kf.name() << " q scale " << qs << " i=" << i;
    }
}

// The affine tensor-core tiles copy codes in 16-byte chunks and scales and
// biases a key's row at a time where the planes are aligned for that, else
// piece by piece (stage_plane): the cache's planes moved 2 bytes off that
// alignment give the same bits in every variant.
TEST(CudaOps, AttentionAffineTilesStageUnalignedPlanes) {
  REQUIRE_GPU();
  for (const KvFormat& kf : {KvFormat::affine(4, 64), KvFormat::affine(8, 32)}) {
    const AttnCase ac{128, 8, 2, kf, kf};
    AttnFixture f(ac, 300, 29);
    const std::vector<JobSpec> specs = {
        {{{0, 300}, {0, 0}}, 1}, {{{7, 40}, {0, 0}}, 2}, {{{250, 300}, {0, 100}}, 3}};
    const auto q = queries(f, specs);
    std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> copies;
    auto moved = [&](const KvPlanes& planes) {
      kernels::KvSide s = planes.side(true);
      for (size_t p = 0; p < planes.units.size(); ++p) {
        const size_t bytes = planes.H * planes.C * planes.units[p];
        copies.push_back(std::make_unique<DeviceBuffer<uint8_t>>(bytes + 2));
        CK(cudaMemcpy(copies.back()->get() + 2, s.plane[p], bytes, cudaMemcpyDeviceToDevice));
        s.plane[p] = copies.back()->get() + 2;
      }
      return s;
    };
    const kernels::KvSide k = moved(f.K), v = moved(f.V);
    for (auto variant : {cuda::AttentionVariant::PerBlock, cuda::AttentionVariant::PerWarp,
                         cuda::AttentionVariant::Split}) {
      const auto want = gpu_attention(f, specs, q, variant);
      const auto got = gpu_attention(f, specs, q, variant, &k, &v);
      ASSERT_EQ(first_bit_diff(want, got.data(), want.size()), -1)
          << kf.name() << " variant " << static_cast<int>(variant);
    }
  }
}

// The split variant needs its workspace; asking for it without one is
// refused by name, and Auto without one falls back to the per-block kernel.
TEST(CudaOps, AttentionSplitWithoutWorkspaceIsRefused) {
  REQUIRE_GPU();
  AttnFixture f(AttnCase{64, 8, 2, KvFormat::f16(), KvFormat::f16()}, 64, 5);
  DeviceBuffer<cuda::AttentionJob> jobs(1);
  EXPECT_THROW(cuda::attention_variant(jobs.get(), 1, f.shape(), {f.c.kf, f.c.vf},
                                       cuda::AttentionVariant::Split, nullptr, nullptr),
               ferry::Error);
}

}  // namespace
}  // namespace ferry::test
