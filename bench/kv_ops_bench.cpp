// kv_ops_bench: the cost of BatchKv's row operations on SmolLM2-135M's KV
// shape (30 layers, 3 KV heads, head_dim 64) as the batch (B rows) and the
// context (C tokens per row) grow, for f16 and q4g64 storage.
//
// Each benchmark is named op/format/B/C. Rows hold C tokens of
// pseudo-random K/V written through BatchKv::write (row operations copy
// bytes, so the values do not matter). Where an operation moves bytes,
// bytes_per_second is the KV payload it copies (tokens * bytes_per_token,
// counted once though memcpy reads and writes it) and the counters say how
// many bytes it copies (copied) and allocates zero-filled (zeroed) per call.
// Compare with the memcpy and alloc rows: the machine's copy bandwidth and
// the cost of a fresh zeroed allocation (page faults included).
//
//   alloc         prepare_prefill(B x C) on an empty cache: the zero-filled
//                 allocation every rebuilding operation pays, from whatever
//                 the heap kept of the previous call's buffers (planes above
//                 glibc's mmap threshold are fresh pages every time)
//   alloc_cold    the same after malloc_trim(0): every page faulted in anew
//   merge         merge(B one-row caches of C tokens)
//   extend_inplace  a B-row batch with a spare row slot takes one row
//                 (copies only the joining row)
//   extend_rebuild  a B-row batch at full row capacity takes one row
//                 (allocates 2B row slots, copies B + 1 rows)
//   filter_first  row 0 of B leaves (B - 1 rows move down one slot)
//   filter_last   row B - 1 leaves (no bytes move)
//   extract       row B / 2 as a standalone cache
//   align         every row (C - 64 tokens) moves 64 columns
//   spec_round    spec_begin, reserve + commit 4 tokens per row,
//                 spec_rollback keeping 0: metadata only
//
// Setup and teardown (building batches, freeing results, undoing an
// operation) run with the timer paused. Configurations whose batch would
// exceed kMaxBatchBytes are not registered (f16 at 64 x 4096 is 6 GB).
#include <benchmark/benchmark.h>

#include <malloc.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kv/batch_kv.h"

namespace {

using namespace ferry;
using kernels::KvFormat;

constexpr size_t kLayers = 30, kKvHeads = 3, kHeadDim = 64;
// Largest batch (B * C * bytes_per_token) registered. extend_rebuild holds
// the old batch and one with twice the row slots at once: up to 3x this.
constexpr double kMaxBatchBytes = 1.8e9;
// Tokens align shifts rows by; trimmed off first so the shift fits.
constexpr size_t kAlignShift = 64;
constexpr size_t kDraft = 4;  // tokens per row in a speculative round
// Bytes the paused undo of each filter benchmark may copy per repetition.
constexpr double kUndoBytes = 2e9;

kv::KvSpec spec_for(KvFormat f) {
  return kv::KvSpec::uniform(kLayers, kKvHeads, kHeadDim, f, f);
}

size_t bytes_per_token(KvFormat f) {
  return kv::BatchKv(spec_for(f)).bytes_per_token();
}

// One row of `len` tokens written through the normal step path. Cached:
// every benchmark of a (format, C) merges copies of the same row.
const kv::BatchKv& row_of(KvFormat f, size_t len) {
  static std::map<std::pair<std::string, size_t>, std::unique_ptr<kv::BatchKv>> cache;
  auto& slot = cache[{f.name(), len}];
  if (slot) return *slot;
  slot = std::make_unique<kv::BatchKv>(spec_for(f));
  slot->prepare_prefill(std::span<const size_t>(&len, 1));
  slot->reserve(std::span<const size_t>(&len, 1));
  std::vector<float> k(kKvHeads * kHeadDim), v(k.size());
  uint32_t state = 12345;
  auto next = [&] {  // xorshift32 mapped to [-2, 2)
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return static_cast<float>(state) * (4.0f / 4294967296.0f) - 2.0f;
  };
  for (size_t l = 0; l < kLayers; ++l)
    for (size_t t = 0; t < len; ++t) {
      for (size_t i = 0; i < k.size(); ++i) {
        k[i] = next();
        v[i] = next();
      }
      slot->write(l, 0, t, k.data(), v.data());
    }
  slot->commit(std::span<const size_t>(&len, 1));
  slot->finalize_prefill();
  return *slot;
}

kv::BatchKv batch_of(KvFormat f, size_t rows, size_t len) {
  std::vector<const kv::BatchKv*> parts(rows, &row_of(f, len));
  return kv::BatchKv::merge(parts);
}

std::vector<size_t> iota(size_t begin, size_t end) {
  std::vector<size_t> v(end - begin);
  std::iota(v.begin(), v.end(), begin);
  return v;
}

// Per-call figures: bytes_per_second from `copied`, and both as counters.
void report(benchmark::State& state, double copied, double zeroed) {
  if (copied > 0)
    state.SetBytesProcessed(static_cast<int64_t>(copied * static_cast<double>(state.iterations())));
  state.counters["copied"] =
      benchmark::Counter(copied, benchmark::Counter::kDefaults, benchmark::Counter::kIs1024);
  state.counters["zeroed"] =
      benchmark::Counter(zeroed, benchmark::Counter::kDefaults, benchmark::Counter::kIs1024);
}

// Destroys `kv` with the timer paused (freeing is teardown, not the op).
void drop(benchmark::State& state, kv::BatchKv& kv) {
  state.PauseTiming();
  kv = kv::BatchKv(kv.spec());
  state.ResumeTiming();
}

void bm_alloc(benchmark::State& state, KvFormat f, size_t B, size_t C) {
  const std::vector<size_t> lengths(B, C);
  for (auto _ : state) {
    kv::BatchKv kv(spec_for(f));
    kv.prepare_prefill(lengths);
    benchmark::DoNotOptimize(kv.allocated_bytes());
    drop(state, kv);
  }
  report(state, 0, static_cast<double>(B * C * bytes_per_token(f)));
}

// The same with the allocator's free memory handed back to the kernel first
// (malloc_trim), so every page is faulted in fresh: what an allocation costs
// when the heap has no recycled memory of that size.
void bm_alloc_cold(benchmark::State& state, KvFormat f, size_t B, size_t C) {
  const std::vector<size_t> lengths(B, C);
  for (auto _ : state) {
    state.PauseTiming();
    malloc_trim(0);
    state.ResumeTiming();
    kv::BatchKv kv(spec_for(f));
    kv.prepare_prefill(lengths);
    benchmark::DoNotOptimize(kv.allocated_bytes());
    drop(state, kv);
  }
  report(state, 0, static_cast<double>(B * C * bytes_per_token(f)));
}

void bm_merge(benchmark::State& state, KvFormat f, size_t B, size_t C) {
  std::vector<const kv::BatchKv*> parts(B, &row_of(f, C));
  for (auto _ : state) {
    kv::BatchKv out = kv::BatchKv::merge(parts);
    benchmark::DoNotOptimize(out.rows());
    drop(state, out);
  }
  const double bytes = static_cast<double>(B * C * bytes_per_token(f));
  report(state, bytes, bytes);
}

void bm_extend_inplace(benchmark::State& state, KvFormat f, size_t B, size_t C) {
  const kv::BatchKv& joiner = row_of(f, C);
  kv::BatchKv batch = batch_of(f, B + 1, C);
  const std::vector<size_t> first_b = iota(0, B);
  batch.filter(first_b);  // B rows, B + 1 row slots
  for (auto _ : state) {
    batch.extend(joiner);
    state.PauseTiming();
    if (batch.row_capacity() != B + 1) state.SkipWithError("extend rebuilt the batch");
    batch.filter(first_b);  // the joiner leaves again: no bytes move
    state.ResumeTiming();
  }
  report(state, static_cast<double>(C * bytes_per_token(f)), 0);
}

void bm_extend_rebuild(benchmark::State& state, KvFormat f, size_t B, size_t C) {
  const kv::BatchKv& joiner = row_of(f, C);
  size_t row_cap = 0;
  for (auto _ : state) {
    state.PauseTiming();
    kv::BatchKv batch = batch_of(f, B, C);  // B rows in B slots
    state.ResumeTiming();
    batch.extend(joiner);
    row_cap = batch.row_capacity();
    drop(state, batch);
  }
  const size_t bpt = bytes_per_token(f);
  report(state, static_cast<double>((B + 1) * C * bpt), static_cast<double>(row_cap * C * bpt));
}

void bm_filter(benchmark::State& state, KvFormat f, size_t B, size_t C, bool first) {
  const kv::BatchKv& joiner = row_of(f, C);
  kv::BatchKv batch = batch_of(f, B, C);
  const std::vector<size_t> keep = first ? iota(1, B) : iota(0, B - 1);
  for (auto _ : state) {
    batch.filter(keep);
    state.PauseTiming();
    batch.extend(joiner);  // back to B rows, in place
    state.ResumeTiming();
  }
  report(state, first ? static_cast<double>((B - 1) * C * bytes_per_token(f)) : 0.0, 0);
}

void bm_extract(benchmark::State& state, KvFormat f, size_t B, size_t C) {
  const kv::BatchKv batch = batch_of(f, B, C);
  for (auto _ : state) {
    kv::BatchKv one = batch.extract(B / 2);
    benchmark::DoNotOptimize(one.rows());
    drop(state, one);
  }
  const double bytes = static_cast<double>(C * bytes_per_token(f));
  report(state, bytes, bytes);
}

void bm_align(benchmark::State& state, KvFormat f, size_t B, size_t C) {
  kv::BatchKv batch = batch_of(f, B, C);
  batch.trim(kAlignShift);  // rows of C - 64 tokens in C columns
  const std::vector<size_t> left(B, 0), right(B, kAlignShift);
  bool at_left = true;
  for (auto _ : state) {
    batch.align(at_left ? right : left);
    at_left = !at_left;
  }
  report(state, static_cast<double>(B * (C - kAlignShift) * bytes_per_token(f)), 0);
}

void bm_spec_round(benchmark::State& state, KvFormat f, size_t B, size_t C) {
  kv::BatchKv batch = batch_of(f, B, C);
  batch.trim(kAlignShift);  // room for the draft without reallocating
  const std::vector<size_t> draft(B, kDraft), none(B, 0);
  for (auto _ : state) {
    batch.spec_begin();
    batch.reserve(draft);
    batch.commit(draft);
    batch.spec_rollback(none);
  }
  report(state, 0, 0);
}

void bm_memcpy(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> src(n, 1), dst(n, 2);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n);
    benchmark::ClobberMemory();
  }
  report(state, static_cast<double>(n), 0);
}

void register_all() {
  benchmark::RegisterBenchmark("memcpy", bm_memcpy)
      ->Arg(4 << 20)
      ->Arg(32 << 20)
      ->Arg(256 << 20)
      ->Arg(1 << 30)
      ->Unit(benchmark::kMillisecond);
  using Op = void (*)(benchmark::State&, KvFormat, size_t, size_t);
  const std::vector<std::pair<std::string, Op>> ops = {
      {"alloc", bm_alloc},
      {"alloc_cold", bm_alloc_cold},
      {"merge", bm_merge},
      {"extend_inplace", bm_extend_inplace},
      {"extend_rebuild", bm_extend_rebuild},
      {"filter_first",
       [](benchmark::State& s, KvFormat f, size_t B, size_t C) { bm_filter(s, f, B, C, true); }},
      {"filter_last",
       [](benchmark::State& s, KvFormat f, size_t B, size_t C) { bm_filter(s, f, B, C, false); }},
      {"extract", bm_extract},
      {"align", bm_align},
      {"spec_round", bm_spec_round},
  };
  for (const auto& [name, op] : ops)
    for (KvFormat f : {KvFormat::f16(), KvFormat::affine(4, 64)})
      for (size_t B : {1, 4, 16, 64})
        for (size_t C : {128, 1024, 4096}) {
          if (static_cast<double>(B * C * bytes_per_token(f)) > kMaxBatchBytes) continue;
          const std::string full =
              name + "/" + f.name() + "/B:" + std::to_string(B) + "/C:" + std::to_string(C);
          auto* b = benchmark::RegisterBenchmark(
              full.c_str(), [op, f, B, C](benchmark::State& s) { op(s, f, B, C); });
          b->Unit(benchmark::kMicrosecond);
          // filter's undo (an extend copying one row, paused) can cost 1000x
          // the timed call (filter_last moves no bytes): iteration counts
          // picked from the timed part alone would run for hours. A fixed
          // count keeps the undo traffic near kUndoBytes per repetition.
          if (name.rfind("filter", 0) == 0) {
            const double undo = static_cast<double>(C * bytes_per_token(f));
            b->Iterations(static_cast<benchmark::IterationCount>(
                std::clamp(kUndoBytes / undo, 20.0, 2000.0)));
          }
        }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("cpu", bench::cpu_model());
  benchmark::AddCustomContext("load_at_start", bench::load_average());
  for (KvFormat f : {KvFormat::f16(), KvFormat::affine(4, 64)})
    benchmark::AddCustomContext("bytes_per_token_" + f.name(), std::to_string(bytes_per_token(f)));
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  std::printf("# load at end: %s\n", bench::load_average().c_str());
  benchmark::Shutdown();
  return 0;
}
