#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace ferry {

namespace {

// state_'s fields.
uint32_t gen_of(uint64_t s) {
  return static_cast<uint32_t>(s >> 32);
}
size_t count_of(uint64_t s) {
  return (s >> 16) & 0xffff;
}
size_t next_of(uint64_t s) {
  return s & 0xffff;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Spins until ready() or `micros` have passed; returns ready(). Between
// short bursts of `pause` it yields the core: on a machine busier than the
// pool (other processes, or more threads than cores) the thread it waits
// for may be queued behind it on this very core, and a pure spin would
// hold that thread off for the whole budget. With a core to itself, the
// yield returns at once.
template <class Ready>
bool spin_until(Ready ready, int64_t micros) {
  if (micros <= 0) return ready();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(micros);
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
    std::this_thread::yield();
    if (ready()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return ready();
  }
}

}  // namespace

ThreadPool::ThreadPool(size_t n_threads) {
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  if (n_threads == 0) n_threads = hw;
  // More threads than cores: a spinning thread could hold the core the
  // thread it waits for needs, so sleep at once.
  spin_micros_ = n_threads <= hw ? kSpinMicros : 0;
  for (size_t i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks(uint32_t gen) {
  for (;;) {
    uint64_t s = state_.load(std::memory_order_acquire);
    do {
      if (gen_of(s) != gen || next_of(s) >= count_of(s)) return;
    } while (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel,
                                           std::memory_order_acquire));
    const size_t begin = next_of(s) * job_chunk_;
    (*job_)(begin, std::min(job_n_, begin + job_chunk_));
    // seq_cst, paired with the caller's store of caller_sleeping_.
    if (chunks_done_.fetch_add(1) + 1 == count_of(s) && caller_sleeping_.load()) {
      { std::lock_guard<std::mutex> lock(mu_); }
      done_cv_.notify_all();
    }
  }
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;
  auto fresh = [&] {
    return stop_.load(std::memory_order_relaxed) ||
           gen_of(state_.load(std::memory_order_acquire)) != seen;
  };
  for (;;) {
    if (!spin_until(fresh, spin_micros_)) {
      sleepers_.fetch_add(1);  // seq_cst, paired with parallel_for's store of state_
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, fresh);
      sleepers_.fetch_sub(1);
    }
    if (stop_.load()) return;
    seen = gen_of(state_.load(std::memory_order_acquire));
    run_chunks(seen);
  }
}

void ThreadPool::parallel_for(size_t n, size_t grain, RangeFn fn) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  const size_t threads = size();
  if (threads == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  // A few chunks per thread balances uneven chunks (and a thread the OS
  // took away) without much overhead.
  const size_t target_chunks = std::min<size_t>(threads * 4, 0xffff);
  size_t chunk = (n + target_chunks - 1) / target_chunks;
  chunk = (chunk + grain - 1) / grain * grain;
  const uint64_t n_chunks = (n + chunk - 1) / chunk;
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  chunks_done_.store(0, std::memory_order_relaxed);
  const uint32_t gen = gen_of(state_.load(std::memory_order_relaxed)) + 1;
  state_.store(static_cast<uint64_t>(gen) << 32 | n_chunks << 16);  // seq_cst: publishes the job
  if (sleepers_.load() > 0) {
    // Taking the lock orders this after a sleeper's check of its predicate.
    { std::lock_guard<std::mutex> lock(mu_); }
    start_cv_.notify_all();
  }
  run_chunks(gen);
  auto done = [&] { return chunks_done_.load(std::memory_order_acquire) == n_chunks; };
  if (!spin_until(done, spin_micros_)) {
    caller_sleeping_.store(true);  // seq_cst, paired with run_chunks' last fetch_add
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, done);
    caller_sleeping_.store(false);
  }
  job_ = nullptr;
}

}  // namespace ferry
