#include "core/thread_pool.h"

#include <algorithm>

namespace ferry {

ThreadPool::ThreadPool(size_t n_threads) {
  if (n_threads == 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
  for (size_t i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks() {
  // Called with mu_ unlocked; grabs chunks until none are left.
  for (;;) {
    size_t c;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (next_chunk_ >= n_chunks_) return;
      c = next_chunk_++;
    }
    size_t begin = c * job_chunk_;
    size_t end = std::min(job_n_, begin + job_chunk_);
    (*job_)(begin, end);
    bool last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = ++chunks_done_ == n_chunks_;
    }
    if (last) done_cv_.notify_all();
  }
}

void ThreadPool::worker_loop(size_t) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_chunks();
  }
}

void ThreadPool::parallel_for(size_t n, size_t grain,
                              const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  size_t threads = size();
  if (threads == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  // A few chunks per thread balances uneven chunks without much overhead.
  size_t target_chunks = threads * 4;
  size_t chunk = (n + target_chunks - 1) / target_chunks;
  chunk = (chunk + grain - 1) / grain * grain;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    n_chunks_ = (n + chunk - 1) / chunk;
    next_chunk_ = 0;
    chunks_done_ = 0;
    ++generation_;
  }
  start_cv_.notify_all();
  run_chunks();
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return chunks_done_ == n_chunks_; });
  job_ = nullptr;
}

}  // namespace ferry
