// Harness for the promise that matters most (issue 3, item 12): every row's logits at
// every step are bit-identical to its solo run, while other rows join
// (merge, extend), leave (filter, extract), roll back speculative tokens
// and prefill in random chunks around it; for dense and quantized KV.
//
// Each request's solo run is greedy; the batched run feeds the solo run's
// tokens (teacher forcing), so both runs see the same token sequences and
// every logits vector can be compared bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "core/cpu.h"
#include "model/model.h"
#include "model/test_models.h"

namespace ferry::model {
namespace {

using kernels::KvFormat;

struct Request {
  std::vector<int32_t> prompt;
  size_t max_tokens;
  // Solo reference: tokens[i] is the greedy token after logits[i]; logits[0]
  // is the last prompt position's.
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

size_t argmax(const float* v, size_t n) {
  return static_cast<size_t>(std::max_element(v, v + n) - v);
}

void solo_run(const Model& m, const kernels::Context& ctx, const kv::KvSpec& spec, Request& r) {
  const size_t V = m.config().vocab_size;
  kv::BatchKv kv(spec, m.kv_allocator());
  const size_t len = r.prompt.size();
  kv.prepare_prefill(std::span<const size_t>(&len, 1));
  std::vector<float> logits;
  RowInput in{r.prompt, false};
  m.forward(ctx, kv, std::span<const RowInput>(&in, 1), logits);
  kv.finalize_prefill();
  for (size_t s = 0; s < r.max_tokens; ++s) {
    r.logits.emplace_back(logits.begin(), logits.begin() + V);
    r.tokens.push_back(static_cast<int32_t>(argmax(logits.data(), V)));
    in = RowInput{std::span<const int32_t>(&r.tokens.back(), 1), false};
    m.forward(ctx, kv, std::span<const RowInput>(&in, 1), logits);
  }
}

// A row of the batched run.
struct Live {
  size_t req;
  size_t fed = 0;  // generated tokens already in the cache
};

class Schedule {
 public:
  Schedule(const Model& m, const kernels::Context& ctx, const kv::KvSpec& spec,
           std::vector<Request>& reqs, uint32_t seed)
      : m_(m), ctx_(ctx), spec_(spec), reqs_(reqs), rng_(seed), batch_(spec, m.kv_allocator()) {}

  void run() {
    size_t next = 0;
    while (next < reqs_.size() || !live_.empty()) {
      const int action = static_cast<int>(rng_() % 10);
      if (next < reqs_.size() && (live_.empty() || action < 3)) {
        join(next++);
      } else if (action < 5) {
        spec_round();
      } else if (action == 5 && live_.size() > 1) {
        extract_and_rejoin();
      } else {
        decode_step();
      }
      leave_finished();
      batch_.check_integrity();
    }
  }
  size_t compared() const { return compared_; }

 private:
  void expect_logits(size_t req, size_t step, const float* got) {
    const size_t V = m_.config().vocab_size;
    const auto& want = reqs_[req].logits[step];
    ASSERT_EQ(std::memcmp(got, want.data(), V * 4), 0) << "request " << req << " step " << step;
    ++compared_;
  }

  // Prefill a newcomer alone in random chunks, then join the batch by
  // extend (or by merge, rebuilding the batch).
  void join(size_t req) {
    Request& r = reqs_[req];
    kv::BatchKv solo(spec_, m_.kv_allocator());
    const size_t len = r.prompt.size();
    solo.prepare_prefill(std::span<const size_t>(&len, 1));
    std::vector<float> logits;
    for (size_t i = 0; i < len;) {
      size_t n = std::min<size_t>(1 + rng_() % 7, len - i);
      RowInput in{std::span<const int32_t>(r.prompt).subspan(i, n), false};
      m_.forward(ctx_, solo, std::span<const RowInput>(&in, 1), logits);
      i += n;
    }
    solo.finalize_prefill();
    expect_logits(req, 0, logits.data());
    if (rng_() % 2 || batch_.rows() == 0) {
      batch_.extend(solo);
    } else {
      std::vector<const kv::BatchKv*> parts{&batch_, &solo};
      batch_ = kv::BatchKv::merge(parts);
    }
    live_.push_back(Live{req, 0});
  }

  // Every live row feeds its next token (rows done generating sit out).
  void decode_step() {
    std::vector<RowInput> rows(live_.size());
    std::vector<size_t> outs;
    for (size_t b = 0; b < live_.size(); ++b) {
      const Request& r = reqs_[live_[b].req];
      if (live_[b].fed + 1 >= r.max_tokens) continue;
      rows[b] = RowInput{std::span<const int32_t>(&r.tokens[live_[b].fed], 1), false};
      outs.push_back(b);
    }
    if (outs.empty()) return;
    std::vector<float> logits;
    m_.forward(ctx_, batch_, rows, logits);
    const size_t V = m_.config().vocab_size;
    for (size_t i = 0; i < outs.size(); ++i) {
      Live& l = live_[outs[i]];
      ++l.fed;
      expect_logits(l.req, l.fed, &logits[i * V]);
    }
  }

  // Each row feeds its true next token plus up to 4 drafts, of which a
  // random prefix is correct; verify all positions, then keep per row the
  // true token plus the correct drafts.
  void spec_round() {
    const size_t V = m_.config().vocab_size;
    std::vector<std::vector<int32_t>> feed(live_.size());
    std::vector<size_t> good(live_.size(), 0);
    std::vector<RowInput> rows(live_.size());
    batch_.spec_begin();
    for (size_t b = 0; b < live_.size(); ++b) {
      const Request& r = reqs_[live_[b].req];
      const size_t left = r.max_tokens - 1 - live_[b].fed;  // tokens still to feed
      if (left == 0) continue;
      const size_t width = 1 + rng_() % std::min<size_t>(5, left);
      good[b] = 1 + rng_() % width;  // true token + correct drafts
      for (size_t i = 0; i < width; ++i)
        feed[b].push_back(i < good[b] ? r.tokens[live_[b].fed + i]
                                      : static_cast<int32_t>(rng_() % V));
      rows[b] = RowInput{feed[b], true};
    }
    std::vector<float> logits;
    m_.forward(ctx_, batch_, rows, logits);
    size_t o = 0;
    std::vector<size_t> keep(live_.size(), 0);
    for (size_t b = 0; b < live_.size(); ++b) {
      for (size_t i = 0; i < feed[b].size(); ++i, ++o)
        if (i < good[b]) expect_logits(live_[b].req, live_[b].fed + 1 + i, &logits[o * V]);
      keep[b] = good[b];
      live_[b].fed += good[b];
    }
    batch_.spec_rollback(keep);
  }

  void extract_and_rejoin() {
    const size_t b = rng_() % live_.size();
    kv::BatchKv row = batch_.extract(b);
    std::vector<size_t> keep;
    for (size_t i = 0; i < live_.size(); ++i)
      if (i != b) keep.push_back(i);
    Live l = live_[b];
    batch_.filter(keep);
    live_.erase(live_.begin() + static_cast<long>(b));
    batch_.extend(row);
    live_.push_back(l);
  }

  void leave_finished() {
    std::vector<size_t> keep;
    std::vector<Live> next;
    for (size_t b = 0; b < live_.size(); ++b)
      if (live_[b].fed + 1 < reqs_[live_[b].req].max_tokens) {
        keep.push_back(b);
        next.push_back(live_[b]);
      }
    if (keep.size() == live_.size()) return;
    batch_.filter(keep);
    live_ = std::move(next);
  }

  const Model& m_;
  const kernels::Context& ctx_;
  const kv::KvSpec& spec_;
  std::vector<Request>& reqs_;
  std::mt19937 rng_;
  kv::BatchKv batch_;
  std::vector<Live> live_;
  size_t compared_ = 0;
};

// Runs n_requests random requests through a random schedule on `m` (on
// its backend: the CPU with ctx's threads, or a device set with
// set_backend) and checks every logits vector against the solo run.
inline void run_schedule(const Model& m, KvFormat kf, KvFormat vf, size_t n_requests,
                         uint32_t seed) {
  ThreadPool pool(2);
  kernels::Context ctx{&pool, best_cpu_path()};
  const kv::KvSpec spec = m.config().kv_spec(kf, vf);
  std::mt19937 rng(seed);
  std::vector<Request> reqs(n_requests);
  for (auto& r : reqs) {
    r.prompt.resize(1 + rng() % 24);
    for (auto& t : r.prompt) t = static_cast<int32_t>(rng() % m.config().vocab_size);
    r.max_tokens = 2 + rng() % 10;
    solo_run(m, ctx, spec, r);
  }
  Schedule s(m, ctx, spec, reqs, seed + 1);
  s.run();
  size_t expected = 0;
  for (const auto& r : reqs) expected += r.max_tokens;
  EXPECT_EQ(s.compared(), expected);  // every step of every request was checked
}

}  // namespace
}  // namespace ferry::model
