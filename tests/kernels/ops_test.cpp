// Op consistency: every op × dtype × kernel path against the reference
// path, bit for bit (docs/KERNELS.md: all paths share one reduction order),
// and the reference against a float64 computation within a stated bound.
// Also the batch-invariance invariant: an output element never depends on
// the number of rows in the call or the number of threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/cpu.h"
#include "core/error.h"
#include "core/half.h"
#include "kernels/kernel_test_util.h"
#include "kernels/ops.h"
#include "kernels/path_kernels.h"
#include "kernels/quant_blocks.h"

namespace ferry::kernels {
namespace {

using test::available_paths;
using test::kAllTypes;
using test::random_floats;
using test::random_weights;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(Kernels, MachineHasFastPath) {
  // Documented, not required: which path this machine runs.
  std::printf("best path: %s\n", std::string(cpu_path_name(best_cpu_path())).c_str());
  SUCCEED();
}

TEST(Kernels, DotAllPathsBitIdenticalAndCloseToFloat64) {
  for (size_t n : {16u, 48u, 576u, 1536u}) {
    auto a = random_floats(n, 1), b = random_floats(n, 2);
    double exact = 0, mag = 0;
    for (size_t i = 0; i < n; ++i) {
      exact += static_cast<double>(a[i]) * b[i];
      mag += std::fabs(static_cast<double>(a[i]) * b[i]);
    }
    float ref = dot(CpuPath::Reference, a.data(), b.data(), n);
    // Summation error bound: n * eps * sum|a_i b_i| (a loose, standard bound).
    EXPECT_LE(std::fabs(ref - exact), n * 0x1p-24 * mag) << n;
    for (CpuPath p : available_paths()) {
      float got = dot(p, a.data(), b.data(), n);
      EXPECT_EQ(std::memcmp(&got, &ref, 4), 0) << cpu_path_name(p) << " n=" << n;
    }
  }
}

class MatmulTest : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulTest, PathsRowsAndThreadsGiveIdenticalBits) {
  const DType t = GetParam();
  const size_t block = dtype_traits(t).block_elems;
  const size_t K = block == 256 ? 512 : 96, N = 37, R = 18;  // R % 4 != 0: remainder rows
  auto wbytes = random_weights(t, K, N, 7);
  WeightView w{t, wbytes.data(), K, N};
  auto x = random_floats(R * K, 11);

  // float64 reference from decoded weights.
  std::vector<float> wf(K * N);
  decode_row(t, wbytes.data(), wf.data(), K * N);
  std::vector<float> ref(R * N);
  matmul(Context{nullptr, CpuPath::Reference}, w, x.data(), R, ref.data());
  for (size_t r = 0; r < R; ++r)
    for (size_t j = 0; j < N; ++j) {
      double e = 0, mag = 0;
      for (size_t k = 0; k < K; ++k) {
        e += static_cast<double>(wf[j * K + k]) * x[r * K + k];
        mag += std::fabs(static_cast<double>(wf[j * K + k]) * x[r * K + k]);
      }
      ASSERT_LE(std::fabs(ref[r * N + j] - e), K * 0x1p-24 * mag + 1e-30);
    }

  for (CpuPath p : available_paths()) {
    for (size_t threads : {1u, 2u, 3u}) {
      ThreadPool pool(threads);
      Context ctx{&pool, p};
      std::vector<float> all(R * N);
      matmul(ctx, w, x.data(), R, all.data());
      EXPECT_TRUE(same_bits(all, ref)) << cpu_path_name(p) << " threads=" << threads;
      // Each row alone gives the same bits as inside the batch of 18.
      for (size_t r = 0; r < R; r += 5) {
        std::vector<float> one(N);
        matmul(ctx, w, x.data() + r * K, 1, one.data());
        EXPECT_EQ(std::memcmp(one.data(), &ref[r * N], N * 4), 0) << "row " << r;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulTest, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) {
                           return std::string(dtype_traits(info.param).name);
                         });

TEST(Kernels, AttentionPathsIdenticalAndMatchesFloat64Softmax) {
  const AttentionShape s{4, 2, 32, 1.0f / std::sqrt(32.0f)};
  const size_t n_keys = 29, cap = 40;
  auto q = random_floats(s.n_heads * s.head_dim, 3);
  auto k = random_floats(s.n_kv_heads * cap * s.head_dim, 4);
  auto v = random_floats(s.n_kv_heads * cap * s.head_dim, 5);
  auto side = [&](const std::vector<float>& data) {
    KvSide sd;
    sd.format = KvFormat::f32();
    sd.plane[0] = reinterpret_cast<const uint8_t*>(data.data());
    sd.head_stride[0] = cap * s.head_dim * 4;
    sd.unit[0] = s.head_dim * 4;
    return sd;
  };
  const KvSide ks = side(k), vs = side(v);
  const KeySegment all{0, n_keys}, none{};
  auto run = [&](CpuPath p, size_t threads, KeySegment s0, KeySegment s1) {
    std::vector<float> out(s.n_heads * s.head_dim);
    AttentionTask t;
    t.q = q.data();
    t.out = out.data();
    t.k = &ks;
    t.v = &vs;
    t.seg[0] = s0;
    t.seg[1] = s1;
    ThreadPool pool(threads);
    attention(Context{&pool, p}, s, std::span<const AttentionTask>(&t, 1));
    return out;
  };
  auto ref = run(CpuPath::Reference, 1, all, none);
  for (size_t h = 0; h < s.n_heads; ++h) {
    size_t kvh = h / 2;
    std::vector<double> sc(n_keys);
    double mx = -1e300, sum = 0;
    for (size_t j = 0; j < n_keys; ++j) {
      double d = 0;
      for (size_t i = 0; i < s.head_dim; ++i)
        d += static_cast<double>(q[h * s.head_dim + i]) * k[(kvh * cap + j) * s.head_dim + i];
      sc[j] = d * s.scale;
      mx = std::max(mx, sc[j]);
    }
    for (auto& x : sc) sum += x = std::exp(x - mx);
    for (size_t i = 0; i < s.head_dim; ++i) {
      double o = 0;
      for (size_t j = 0; j < n_keys; ++j) o += sc[j] / sum * v[(kvh * cap + j) * s.head_dim + i];
      // Values in [-1, 1], 29 keys: float32 rounding stays far below 1e-5.
      EXPECT_NEAR(ref[h * s.head_dim + i], o, 1e-5);
    }
  }
  for (CpuPath p : available_paths())
    for (size_t threads : {1u, 2u})
      EXPECT_TRUE(same_bits(run(p, threads, all, none), ref)) << cpu_path_name(p);
  // A wrapped ring (two segments, 36 keys, the exponentials in two full
  // vectors and a tail): every path the reference's bits.
  const auto ref2 = run(CpuPath::Reference, 1, {17, cap}, {0, 13});
  for (CpuPath p : available_paths())
    EXPECT_TRUE(same_bits(run(p, 2, {17, cap}, {0, 13}), ref2)) << cpu_path_name(p);
}

// The softmax's exponential (vec16.h, canonical_exp): the same bits on every
// path, in a vector lane or a tail element, and within 2 ulp of e^x where
// the result is normal; 0 below -104, inf above 88, NaN kept.
TEST(Kernels, AttentionExpIsOneFunctionOnEveryPath) {
  std::vector<float> x;
  for (float v = -110.0f; v <= 90.0f; v += 0.0371f) x.push_back(v);
  for (float v : {0.0f, -0.0f, -1e-30f, -103.97f, -104.0f, -87.33f, -87.34f, 88.0f, 88.5f,
                  -INFINITY, INFINITY, NAN, -0.34657359f, 0.34657359f, -0.5f * 0.6931472f})
    x.push_back(v);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-30.0f, 0.0f);
  for (int i = 0; i < 5000; ++i) x.push_back(u(rng));
  auto run = [&](CpuPath p, size_t offset) {
    std::vector<float> y(x.begin() + offset, x.end());
    kernels_for(p).exp_shifted(y.data(), y.size(), 0.0f);
    return y;
  };
  const auto ref = run(CpuPath::Reference, 0);
  for (CpuPath p : available_paths())
    for (size_t offset : {0u, 5u}) {  // each element once in a vector lane, once maybe in the tail
      const auto got = run(p, offset);
      EXPECT_EQ(std::memcmp(got.data(), ref.data() + offset, got.size() * 4), 0)
          << cpu_path_name(p) << " offset " << offset;
    }
  for (size_t i = 0; i < x.size(); ++i) {
    const float v = x[i], y = ref[i];
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(y));
    } else if (v < -104.0f) {
      EXPECT_EQ(y, 0.0f) << v;
    } else if (v > 88.0f) {
      EXPECT_EQ(y, INFINITY) << v;
    } else {
      const double want = std::exp(static_cast<double>(v));
      if (want < 1.1754944e-38) {  // subnormal results: within one subnormal step or so
        EXPECT_NEAR(y, want, 3e-45) << v;
      } else {
        EXPECT_LE(std::fabs(y - want), 2.0 * std::ldexp(1.0, std::ilogb(want) - 23)) << v;
      }
    }
  }
}

// The canonical dot takes whole 16-element runs: other widths are refused
// by name (model loading refuses them first), not read past.
TEST(Kernels, RmsNormRefusesWidthsThatAreNotMultiplesOf16) {
  std::vector<float> x(40, 1.0f), w(40, 1.0f), out(40);
  try {
    rmsnorm(Context{}, x.data(), w.data(), 2, 20, 1e-5f, out.data());
    FAIL() << "dim 20 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dim=20 is not a multiple of 16"), std::string::npos)
        << e.what();
  }
}

TEST(Kernels, RmsNormMatchesDefinition) {
  const size_t dim = 64;
  auto x = random_floats(2 * dim, 9), w = random_floats(dim, 10);
  std::vector<float> out(2 * dim);
  rmsnorm(Context{}, x.data(), w.data(), 2, dim, 1e-5f, out.data());
  for (size_t r = 0; r < 2; ++r) {
    double ss = 0;
    for (size_t i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
    for (size_t i = 0; i < dim; ++i)
      EXPECT_NEAR(out[r * dim + i], x[r * dim + i] * inv * w[i], 1e-6);
  }
}

TEST(Kernels, RopeRotatesAdjacentPairs) {
  // One head, head_dim 4: pairs (0,1) at inv_freq 1 and (2,3) at 0.5.
  float x[4] = {1, 0, 0, 2};
  const float inv_freq[2] = {1.0f, 0.5f};
  rope(x, 1, 4, 2, inv_freq);
  EXPECT_FLOAT_EQ(x[0], std::cos(2.0f));
  EXPECT_FLOAT_EQ(x[1], std::sin(2.0f));
  EXPECT_FLOAT_EQ(x[2], -2 * std::sin(1.0f));
  EXPECT_FLOAT_EQ(x[3], 2 * std::cos(1.0f));
  float y[4] = {3, 4, 5, 6};
  rope(y, 1, 4, 0, inv_freq);  // position 0 is the identity
  EXPECT_EQ(y[0], 3);
  EXPECT_EQ(y[3], 6);
}

TEST(Kernels, SiluMul) {
  float g[3] = {0.0f, 1.0f, -2.0f}, u[3] = {5.0f, 2.0f, 1.0f};
  silu_mul(Context{}, g, u, 3);
  EXPECT_EQ(g[0], 0.0f);
  EXPECT_FLOAT_EQ(g[1], 2.0f / (1.0f + std::exp(-1.0f)));
  EXPECT_FLOAT_EQ(g[2], -2.0f / (1.0f + std::exp(2.0f)));
  // Every path and thread count, vector lanes and tails: the same bits;
  // saturating inputs give g (large g) and -0 (very negative g).
  std::vector<float> gate = random_floats(10000, 21, 12.0f), up = random_floats(10000, 22);
  gate[0] = 200.0f, gate[1] = -200.0f, gate[2] = NAN, gate[3] = -0.0f;
  auto run = [&](CpuPath p, size_t threads, size_t n) {
    std::vector<float> y(gate.begin(), gate.begin() + n);
    ThreadPool pool(threads);
    silu_mul(Context{&pool, p}, y.data(), up.data(), n);
    return y;
  };
  const auto ref = run(CpuPath::Reference, 1, gate.size());
  EXPECT_EQ(ref[0], 200.0f * up[0]);
  EXPECT_TRUE(std::signbit(ref[1] / up[1]) && ref[1] == 0.0f);
  EXPECT_TRUE(std::isnan(ref[2]));
  for (size_t i = 4; i < gate.size(); ++i) {
    const double g = gate[i], want = g / (1.0 + std::exp(-g)) * up[i];
    EXPECT_NEAR(ref[i], want, 1e-6 * std::fabs(want) + 1e-30) << i;
  }
  for (CpuPath p : available_paths())
    for (size_t threads : {1u, 2u})
      for (size_t n : {gate.size(), size_t{37}}) {
        const auto got = run(p, threads, n);
        EXPECT_EQ(std::memcmp(got.data(), ref.data(), n * 4), 0) << cpu_path_name(p);
      }
}

TEST(Kernels, EmbedRejectsOutOfRangeToken) {
  auto wb = random_weights(DType::F32, 16, 4, 1);
  WeightView w{DType::F32, wb.data(), 16, 4};
  std::vector<float> out(16);
  int32_t bad = 4;
  EXPECT_THROW(embed(w, std::span<const int32_t>(&bad, 1), out.data()), Error);
}

}  // namespace
}  // namespace ferry::kernels

namespace ferry::kernels {
namespace {

// The heads of a GQA group run together (attention_group) but each keeps
// its own arithmetic: the output equals, bit for bit, that of the same
// query heads each given a kv head of its own (a copy of its group's), for
// head_dim 64 (two heads' value accumulators at a time) and 128 and 48 (one
// head, whole and in single vectors), groups of 3 (a pair plus one) and 1.
TEST(Kernels, AttentionGroupHeadsEqualHeadsAlone) {
  for (size_t D : {64u, 128u, 48u})
    for (size_t group : {3u, 1u}) {
      const size_t n_kv = 2, n_heads = n_kv * group, cap = 40;
      const AttentionShape grouped{n_heads, n_kv, D, 1.0f / std::sqrt(static_cast<float>(D))};
      const AttentionShape alone{n_heads, n_heads, D, grouped.scale};
      const auto q = random_floats(n_heads * D, 7);
      const auto k = random_floats(n_kv * cap * D, 8), v = random_floats(n_kv * cap * D, 9);
      // Kv head h of the "alone" layout = kv head h / group of the grouped one.
      std::vector<float> k1(n_heads * cap * D), v1(n_heads * cap * D);
      for (size_t h = 0; h < n_heads; ++h)
        for (size_t i = 0; i < cap * D; ++i) {
          k1[h * cap * D + i] = k[(h / group) * cap * D + i];
          v1[h * cap * D + i] = v[(h / group) * cap * D + i];
        }
      auto side = [&](const std::vector<float>& data) {
        KvSide sd;
        sd.format = KvFormat::f32();
        sd.plane[0] = reinterpret_cast<const uint8_t*>(data.data());
        sd.head_stride[0] = cap * D * 4;
        sd.unit[0] = D * 4;
        return sd;
      };
      auto run = [&](const AttentionShape& s, const KvSide& ks, const KvSide& vs, CpuPath p) {
        std::vector<float> out(n_heads * D);
        AttentionTask t;
        t.q = q.data();
        t.out = out.data();
        t.k = &ks;
        t.v = &vs;
        t.seg[0] = {17, cap};  // a wrapped ring: two segments, 36 keys
        t.seg[1] = {0, 13};
        ThreadPool pool(2);
        attention(Context{&pool, p}, s, std::span<const AttentionTask>(&t, 1));
        return out;
      };
      const KvSide ks = side(k), vs = side(v), ks1 = side(k1), vs1 = side(v1);
      for (CpuPath p : available_paths())
        EXPECT_TRUE(same_bits(run(grouped, ks, vs, p), run(alone, ks1, vs1, p)))
            << cpu_path_name(p) << " D=" << D << " group=" << group;
    }
}

// Attention over encoded KV (f16, bf16, affine 8/4-bit) equals attention
// over the same keys decoded to f32, bit for bit, on every path: decoding is
// exact and the reduction order does not depend on the storage.
TEST(Kernels, AttentionOverEncodedKvEqualsDecodedF32) {
  const AttentionShape s{4, 2, 64, 0.125f};
  const size_t n_keys = 21;
  auto q = test::random_floats(s.n_heads * s.head_dim, 31);
  std::vector<CpuPath> paths{CpuPath::Reference};
  if (best_cpu_path() >= CpuPath::Avx2) paths.push_back(CpuPath::Avx2);
  if (best_cpu_path() >= CpuPath::Avx512) paths.push_back(CpuPath::Avx512);
  for (KvFormat f : {KvFormat::f16(), KvFormat::bf16(), KvFormat::affine(8, 32),
                     KvFormat::affine(4, 64), KvFormat::affine(4, 32)}) {
    // Random plane bytes; f16 scale/bias fields kept finite and moderate.
    const auto units = f.plane_units(s.head_dim);
    std::vector<std::vector<uint8_t>> planes;
    std::mt19937 rng(7);
    for (size_t p = 0; p < units.size(); ++p) {
      std::vector<uint8_t> bytes(s.n_kv_heads * n_keys * units[p]);
      for (auto& b : bytes) b = static_cast<uint8_t>(rng());
      if (f.kind != KvFormat::Kind::Affine || p > 0)
        for (size_t i = 0; i + 1 < bytes.size(); i += 2) {
          float v = std::uniform_real_distribution<float>(-1, 1)(rng) * (p == 1 ? 0.05f : 1.0f);
          uint16_t h = f.kind == KvFormat::Kind::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
          std::memcpy(&bytes[i], &h, 2);
        }
      planes.push_back(std::move(bytes));
    }
    KvSide enc;
    enc.format = f;
    for (size_t p = 0; p < units.size(); ++p) {
      enc.plane[p] = planes[p].data();
      enc.head_stride[p] = n_keys * units[p];
      enc.unit[p] = units[p];
    }
    std::vector<float> dec(s.n_kv_heads * n_keys * s.head_dim);
    for (size_t h = 0; h < s.n_kv_heads; ++h)
      for (size_t j = 0; j < n_keys; ++j)
        decode_kv(enc, s.head_dim, h, j, &dec[(h * n_keys + j) * s.head_dim]);
    KvSide plain;
    plain.format = KvFormat::f32();
    plain.plane[0] = reinterpret_cast<const uint8_t*>(dec.data());
    plain.head_stride[0] = n_keys * s.head_dim * 4;
    plain.unit[0] = s.head_dim * 4;
    auto run = [&](const KvSide& side, CpuPath p) {
      std::vector<float> out(s.n_heads * s.head_dim);
      AttentionTask t;
      t.q = q.data();
      t.out = out.data();
      t.k = &side;
      t.v = &side;
      t.seg[0] = {3, 12};  // a ring-like split: slots 3..11 then 0..2
      t.seg[1] = {0, 3};
      attention(Context{nullptr, p}, s, std::span<const AttentionTask>(&t, 1));
      return out;
    };
    const auto want = run(plain, CpuPath::Reference);
    for (CpuPath p : paths) {
      EXPECT_TRUE(same_bits(run(enc, p), want)) << f.name() << " " << cpu_path_name(p);
      EXPECT_TRUE(same_bits(run(plain, p), want)) << f.name() << " " << cpu_path_name(p);
    }
  }
}

}  // namespace
}  // namespace ferry::kernels
