// ThreadPool (src/core/thread_pool.h): what parallel_for promises. Every
// index of [0, n) is covered exactly once by chunks whose sizes are
// multiples of `grain` (all but the last), the call returns only when all of
// them are done (their writes visible to the caller), a one-thread pool or
// n <= grain runs inline, and the lock-free hand-off survives the patterns
// the engine puts it through: thousands of back-to-back calls (a decode
// step), calls after the workers went past their spin and slept, a pool
// destroyed right after use, pools used from different threads (one caller
// at a time, as documented: parallel_for is not reentrant, so nothing here
// nests calls or shares a pool between simultaneous callers). Exceptions
// thrown from a chunk are not part of the documented contract and are not
// tested.
//
// Every test body runs under a watchdog: a hang (a lost wake-up) fails the
// test with a message instead of blocking the suite forever.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace ferry {
namespace {

bool sanitized() {
  return std::getenv("FERRY_SANITIZED") != nullptr;
}

// Runs body on another thread and waits at most `seconds` for it; on a
// timeout the process cannot recover the stuck thread, so it reports and
// aborts (gtest has no per-test timeout).
void with_deadline(int seconds, const char* what, const std::function<void()>& body) {
  if (sanitized()) seconds *= 10;
  auto done = std::async(std::launch::async, body);
  if (done.wait_for(std::chrono::seconds(seconds)) != std::future_status::ready) {
    std::fprintf(stderr, "thread_pool_test: %s did not finish within %d s (hang)\n", what, seconds);
    std::fflush(stderr);
    std::abort();
  }
  done.get();  // rethrows what the body threw
}

const size_t kPoolSizes[] = {1, 2, 3, 4};

// A few dozen ns of deterministic work per index, so chunks take long
// enough for workers to claim some (with empty chunks the caller often
// claims them all before a worker looks).
uint64_t work(size_t i, uint64_t salt) {
  uint64_t h = i * 0x9e3779b97f4a7c15ull + salt;
  for (int k = 0; k < 16; ++k) h = h * 6364136223846793005ull + 1442695040888963407ull;
  return h;
}

// Indices run off the calling thread, over the whole binary: printed, not
// asserted (the API does not promise workers take any chunk).
std::atomic<uint64_t> g_worker_indices{0};
void note_thread(std::thread::id caller, size_t b, size_t e) {
  if (std::this_thread::get_id() != caller) g_worker_indices.fetch_add(e - b);
}

// One parallel_for over [0, n) that records every chunk, then checks the
// documented shape of the split: visits exactly once, chunk sizes multiples
// of grain but the last (which ends at n), begin < end, and no chunk at all
// for n = 0. Returns the number of chunks.
size_t check_one_call(ThreadPool& pool, size_t n, size_t grain, const char* ctx) {
  std::unique_ptr<std::atomic<uint32_t>[]> visits(new std::atomic<uint32_t>[n + 1]);
  for (size_t i = 0; i <= n; ++i) visits[i].store(0, std::memory_order_relaxed);
  std::vector<uint64_t> out(n, 0);  // plain writes, read after the call
  std::atomic<size_t> chunks{0}, bad_chunks{0}, last_chunks{0};
  const auto caller = std::this_thread::get_id();
  pool.parallel_for(n, grain, [&](size_t b, size_t e) {
    chunks.fetch_add(1);
    // A malformed chunk is counted, not indexed, so it cannot write out of
    // bounds.
    if (b >= e || e > n || b % grain != 0 || (e != n && (e - b) % grain != 0)) {
      bad_chunks.fetch_add(1);
      return;
    }
    if (e == n) last_chunks.fetch_add(1);
    note_thread(caller, b, e);
    for (size_t i = b; i < e; ++i) {
      visits[i].fetch_add(1, std::memory_order_relaxed);
      out[i] = work(i, n);
    }
  });
  // Everything below is read after parallel_for returned: a chunk still
  // running would show up as a missing visit.
  EXPECT_EQ(bad_chunks.load(), 0u) << ctx << " n=" << n << " grain=" << grain;
  size_t wrong = 0, first_wrong = n, bad_values = 0;
  for (size_t i = 0; i < n; ++i) {
    if (visits[i].load(std::memory_order_relaxed) != 1) {
      if (wrong++ == 0) first_wrong = i;
    }
    bad_values += out[i] != work(i, n);
  }
  EXPECT_EQ(bad_values, 0u) << ctx << " n=" << n << " grain=" << grain;
  EXPECT_EQ(wrong, 0u) << ctx << " n=" << n << " grain=" << grain << " first index visited "
                       << (first_wrong < n ? visits[first_wrong].load() : 0)
                       << " times: " << first_wrong;
  if (n == 0) {
    EXPECT_EQ(chunks.load(), 0u) << ctx << ": n = 0 must not call fn";
  } else {
    EXPECT_EQ(last_chunks.load(), 1u) << ctx << " n=" << n << " grain=" << grain;
  }
  return chunks.load();
}

TEST(ThreadPool, SizeCountsTheCallingThread) {
  for (size_t t : {1u, 2u, 3u, 4u, 7u}) {
    ThreadPool pool(t);
    EXPECT_EQ(pool.size(), t);
  }
  ThreadPool hw(0);
  EXPECT_EQ(hw.size(), std::max(1u, std::thread::hardware_concurrency()));
}

TEST(ThreadPool, EdgeCasesCoverEveryIndexOnce) {
  with_deadline(60, "EdgeCasesCoverEveryIndexOnce", [] {
    for (size_t t : kPoolSizes) {
      ThreadPool pool(t);
      const std::string ctx = "threads=" + std::to_string(t);
      // n = 0, n < grain, n == grain, just above grain, not a multiple of
      // grain, grain 1 with many more indices than chunks, grain above n.
      const size_t cases[][2] = {{0, 1},
                                 {0, 16},
                                 {1, 1},
                                 {1, 16},
                                 {15, 16},
                                 {16, 16},
                                 {17, 16},
                                 {31, 16},
                                 {33, 16},
                                 {2, 1},
                                 {3, 1},
                                 {5, 1},
                                 {7, 2},
                                 {100, 1},
                                 {100, 7},
                                 {100, 99},
                                 {100, 100},
                                 {100, 101},
                                 {1000, 3},
                                 {4099, 16},
                                 {576, 16},
                                 {1 << 16, 1},
                                 {(1 << 16) + 1, 1},
                                 {1 << 20, 1},
                                 {1 << 20, 4096}};
      for (const auto& c : cases) check_one_call(pool, c[0], c[1], ctx.c_str());
    }
  });
}

TEST(ThreadPool, RandomSizesAndGrainsCoverEveryIndexOnce) {
  with_deadline(60, "RandomSizesAndGrainsCoverEveryIndexOnce", [] {
    std::mt19937 rng(20240611);
    const int iters = sanitized() ? 150 : 600;
    for (size_t t : kPoolSizes) {
      ThreadPool pool(t);
      const std::string ctx = "threads=" + std::to_string(t);
      for (int it = 0; it < iters; ++it) {
        // Mostly small n (where chunking edge cases live), sometimes large.
        const size_t n = rng() % 4 == 0 ? rng() % 20000 : rng() % 200;
        const size_t grain = 1 + (rng() % 3 == 0 ? rng() % 300 : rng() % 20);
        check_one_call(pool, n, grain, ctx.c_str());
      }
    }
  });
}

// A one-thread pool, and any pool with n <= grain, runs inline: one call
// fn(0, n) on the calling thread.
TEST(ThreadPool, RunsInlineOnOneThreadOrOneGrain) {
  with_deadline(30, "RunsInlineOnOneThreadOrOneGrain", [] {
    const auto caller = std::this_thread::get_id();
    auto expect_inline = [&](ThreadPool& pool, size_t n, size_t grain) {
      std::vector<std::pair<size_t, size_t>> calls;  // only the caller touches it
      std::atomic<bool> other_thread{false};
      pool.parallel_for(n, grain, [&](size_t b, size_t e) {
        if (std::this_thread::get_id() != caller) {
          other_thread = true;
          return;
        }
        calls.emplace_back(b, e);
      });
      EXPECT_FALSE(other_thread) << "threads=" << pool.size() << " n=" << n;
      ASSERT_EQ(calls.size(), 1u) << "threads=" << pool.size() << " n=" << n;
      EXPECT_EQ(calls[0].first, 0u);
      EXPECT_EQ(calls[0].second, n);
    };
    ThreadPool one(1);
    for (size_t n : {1u, 2u, 17u, 1000u, 100000u}) expect_inline(one, n, 1);
    for (size_t t : {2u, 3u, 4u}) {
      ThreadPool pool(t);
      for (size_t n : {1u, 5u, 16u}) expect_inline(pool, n, 16);
    }
  });
}

// Plain (non-atomic) writes made in chunks are visible to the caller once
// parallel_for returns, and a chunk that runs long (a worker the OS took
// away) still holds the caller until it ends.
TEST(ThreadPool, ReturnsAfterAllChunksWithTheirWritesVisible) {
  with_deadline(60, "ReturnsAfterAllChunksWithTheirWritesVisible", [] {
    for (size_t t : kPoolSizes) {
      ThreadPool pool(t);
      for (int it = 0; it < 50; ++it) {
        const size_t n = 64 + 37 * it;
        std::vector<uint64_t> out(n, 0);
        pool.parallel_for(n, 4, [&](size_t b, size_t e) {
          // Every few calls, the chunk holding index 0 dawdles.
          if (b == 0 && it % 5 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
          for (size_t i = b; i < e; ++i) out[i] = i * 2654435761u + it;
        });
        for (size_t i = 0; i < n; ++i)
          ASSERT_EQ(out[i], i * 2654435761u + it) << "threads=" << t << " it=" << it;
      }
    }
  });
}

// A decode step issues a few hundred parallel_for calls microseconds apart;
// thousands of back-to-back calls of mixed sizes (including inline ones and
// n = 0) must all complete and cover their ranges.
TEST(ThreadPool, ThousandsOfBackToBackCalls) {
  with_deadline(120, "ThousandsOfBackToBackCalls", [] {
    const int calls = sanitized() ? 1200 : 5000;
    for (size_t t : kPoolSizes) {
      ThreadPool pool(t);
      std::vector<uint64_t> out(4096);
      uint64_t expected_total = 0;
      std::atomic<uint64_t> total{0};
      const auto caller = std::this_thread::get_id();
      for (int c = 0; c < calls; ++c) {
        // Shapes like a step's ops: QKV columns, attention heads, norms.
        static const size_t kShapes[][2] = {{576, 16}, {192, 16}, {1536, 16},       {9, 1},
                                            {15, 16},  {0, 16},   {49152 / 16, 16}, {3, 4}};
        const size_t n = kShapes[c % 8][0], grain = kShapes[c % 8][1];
        pool.parallel_for(n, grain, [&](size_t b, size_t e) {
          note_thread(caller, b, e);
          uint64_t s = 0;
          for (size_t i = b; i < e; ++i) {
            out[i] = work(i, c);
            s += i + 1;
          }
          total.fetch_add(s, std::memory_order_relaxed);
        });
        expected_total += n * (n + 1) / 2;
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], work(i, c)) << "call " << c << " i " << i;
      }
      EXPECT_EQ(total.load(), expected_total) << "threads=" << t;
    }
  });
  std::printf("indices run by workers so far (all tests): %llu\n",
              static_cast<unsigned long long>(g_worker_indices.load()));
}

// After 5 ms idle the workers are past their kSpinMicros spin and asleep on
// the condition variable (and the caller may sleep waiting for the last
// chunk): every call must still wake them, or run without them, and finish.
TEST(ThreadPool, WorksAfterIdleSleeps) {
  static_assert(ThreadPool::kSpinMicros < 5000, "the idle gap must outlast the spin");
  with_deadline(60, "WorksAfterIdleSleeps", [] {
    const int rounds = sanitized() ? 10 : 25;
    for (size_t t : kPoolSizes) {
      ThreadPool pool(t);
      const std::string ctx = "threads=" + std::to_string(t);
      for (int r = 0; r < rounds; ++r) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        check_one_call(pool, 1000 + r, 16, ctx.c_str());
        // A quick follow-up while the workers are awake again, then a call
        // whose chunks outlast the caller's spin so it sleeps for the last.
        check_one_call(pool, 64, 1, ctx.c_str());
        std::atomic<size_t> seen{0};
        pool.parallel_for(8, 1, [&](size_t b, size_t e) {
          std::this_thread::sleep_for(std::chrono::microseconds(600));
          seen.fetch_add(e - b);
        });
        EXPECT_EQ(seen.load(), 8u) << ctx << " round " << r;
      }
    }
  });
}

// Destroying a pool must not hang, whatever its workers are doing: never
// used, right after a call (workers spinning), after they went to sleep.
TEST(ThreadPool, DestructionRightAfterUseDoesNotHang) {
  with_deadline(60, "DestructionRightAfterUseDoesNotHang", [] {
    const int reps = sanitized() ? 40 : 200;
    for (size_t t : kPoolSizes) {
      for (int r = 0; r < reps; ++r) {
        { ThreadPool unused(t); }
        {
          ThreadPool pool(t);
          std::atomic<size_t> sum{0};
          pool.parallel_for(100 + r, 3, [&](size_t b, size_t e) { sum.fetch_add(e - b); });
          EXPECT_EQ(sum.load(), 100u + r);
        }  // destroyed while the workers spin
      }
      ThreadPool pool(t);
      std::atomic<size_t> sum{0};
      pool.parallel_for(50, 1, [&](size_t b, size_t e) { sum.fetch_add(e - b); });
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // workers asleep
      EXPECT_EQ(sum.load(), 50u);
    }
  });
}

// "One caller at a time" allows different threads to take turns on one pool
// (the engine's scheduler thread may change), and separate pools are
// independent even when driven at the same time.
TEST(ThreadPool, CallersTakingTurnsAndIndependentPools) {
  with_deadline(60, "CallersTakingTurnsAndIndependentPools", [] {
    ThreadPool shared(3);
    for (int turn = 0; turn < 6; ++turn) {
      std::thread caller([&] {
        for (int c = 0; c < 100; ++c) check_one_call(shared, 200 + turn * 7 + c, 16, "turns");
      });
      caller.join();
    }
    ThreadPool a(2), b(3);
    auto drive = [](ThreadPool* p, const char* name) {
      std::mt19937 rng(p->size());
      for (int c = 0; c < 300; ++c) check_one_call(*p, rng() % 3000, 1 + rng() % 32, name);
    };
    std::thread ta(drive, &a, "pool a"), tb(drive, &b, "pool b");
    ta.join();
    tb.join();
  });
}

}  // namespace
}  // namespace ferry
