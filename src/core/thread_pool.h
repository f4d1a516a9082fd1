// A fixed pool of worker threads for data-parallel kernels.
//
// Determinism contract: parallel_for only splits independent output ranges;
// kernels never split a reduction across threads, so results do not depend
// on the number of threads.
//
// Cost: a decode step issues a few hundred parallel_for calls a few
// microseconds apart, so the hand-off is lock-free (one atomic word per
// job; a chunk is claimed with a compare-exchange). A worker that finishes
// a job spins for up to kSpinMicros (`pause`, yielding the core between
// bursts), so the next call finds it awake; only then does it sleep on a
// condition variable, and a call pays a wake-up (a futex call) only for
// workers that are asleep. The caller waits for the last chunk the same
// way. An idle pool burns at most kSpinMicros of CPU per thread after its
// last job; a pool with more threads than cores never spins.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace ferry {

// A non-owning reference to a callable `void(size_t begin, size_t end)`:
// unlike std::function it never allocates, whatever the lambda captures.
// Valid only while the callable it was made from lives.
class RangeFn {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, RangeFn>>>
  RangeFn(F&& f)  // NOLINT: implicit, so lambdas pass as they are
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, size_t b, size_t e) {
          (*static_cast<std::remove_reference_t<F>*>(o))(b, e);
        }) {}
  void operator()(size_t begin, size_t end) const { call_(obj_, begin, end); }

 private:
  void* obj_;
  void (*call_)(void*, size_t, size_t);
};

class ThreadPool {
 public:
  // n_threads counts the calling thread; 0 means hardware concurrency.
  explicit ThreadPool(size_t n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return workers_.size() + 1; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n), each chunk a
  // multiple of `grain` (but the last), and returns when all are done. Runs
  // inline when n is small or the pool has one thread. Not reentrant; one
  // caller at a time. fn must not throw: a chunk run on a worker has no one
  // to throw to (ferry's kernels validate before they split work).
  void parallel_for(size_t n, size_t grain, RangeFn fn);

  // How long an idle thread spins before it sleeps (see the top of the
  // file). 200 us covers the gaps between a step's ops (a few us) and
  // ends well before the next step of a busy engine would matter.
  static constexpr int64_t kSpinMicros = 200;

 private:
  void worker_loop();
  // Claims and runs chunks of job `gen` until none are left.
  void run_chunks(uint32_t gen);

  std::vector<std::thread> workers_;
  // The job: written by the caller before it publishes `state_`, read by
  // a thread only after it claimed a chunk of that job (the job cannot end,
  // and so cannot be replaced, while one of its chunks is unfinished).
  const RangeFn* job_ = nullptr;
  size_t job_n_ = 0, job_chunk_ = 0;
  // generation (32 bits) | chunk count (16) | next chunk (16): one word, so
  // a thread that saw an old job can never claim a chunk of a newer one.
  std::atomic<uint64_t> state_{0};
  std::atomic<size_t> chunks_done_{0};
  std::atomic<bool> stop_{false};
  // Sleeping: workers wait for a new generation, the caller for the last
  // chunk. `sleepers_` counts workers inside (or entering) a wait and
  // `caller_sleeping_` says the caller is, so a publisher that sees neither
  // skips the lock and the notify (seq_cst on both sides makes that safe).
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> caller_sleeping_{false};
  int64_t spin_micros_ = kSpinMicros;  // 0 with more threads than cores
};

}  // namespace ferry
