// A fixed pool of worker threads for data-parallel kernels.
//
// Determinism contract: parallel_for only splits independent output ranges;
// kernels never split a reduction across threads, so results do not depend
// on the number of threads.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ferry {

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
  // inline when n is small or the pool has one thread. Not reentrant.
  void parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

 private:
  void worker_loop(size_t index);
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t job_n_ = 0, job_chunk_ = 0, n_chunks_ = 0;
  size_t next_chunk_ = 0, chunks_done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace ferry
