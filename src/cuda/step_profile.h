// Where a GPU step's time goes, for tuning (FERRY_CUDA_PROFILE=1): per step
// the host's time building and enqueuing it, the wait for the device at its
// end, the time between steps (the scheduler, and the device work enqueued
// between steps, which the step's opening synchronisation waits for:
// reported apart, with the longest gap), the device's span, and
// with graphs off the device time per op (events between ops). Printed to
// stderr when the backend is destroyed, split into decode steps (one token
// per row), grouped by their rows in powers of two (a bench's warm-up
// requests run steps of other sizes than its measured ones), and the rest.
// Costs nothing when off.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace ferry::cuda {

class StepProfile {
 public:
  // Whether FERRY_CUDA_PROFILE is set to a non-empty value other than 0.
  static bool requested();
  explicit StepProfile(cudaStream_t stream) : stream_(stream) {}
  ~StepProfile();
  StepProfile(const StepProfile&) = delete;
  StepProfile& operator=(const StepProfile&) = delete;

  // When the step is asked for, before its opening synchronisation (which
  // waits for device work enqueued between steps: KV row operations).
  void opening() { t_open_ = Clock::now(); }
  // After the step's opening synchronisation.
  void begin_step();
  // The step's token rows and outputs (decode steps have as many of each).
  void shape(size_t tokens, size_t outputs) {
    tokens_ = tokens;
    outputs_ = outputs;
  }
  // Before an op's launches (only when ops run one by one).
  void mark(const char* op);
  // When the host has enqueued the step and starts waiting for it.
  void before_wait();
  // After the step's closing synchronisation.
  void end_step();

 private:
  using Clock = std::chrono::steady_clock;
  struct Totals {
    size_t steps = 0, tokens = 0;
    double build = 0, wait = 0, between = 0, device = 0;  // seconds
    double between_sync = 0, between_max = 0;  // of between: the opening sync; the longest
    std::map<std::string, double> ops;                    // device seconds per op
  };
  cudaEvent_t event(size_t i);

  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
  std::vector<const char*> names_;
  size_t tokens_ = 0, outputs_ = 0;
  bool open_ = false;
  Clock::time_point t_open_{}, t_begin_, t_wait_, t_end_{};
  double between_ = 0, between_sync_ = 0;
  // By the largest row count of the group: 1, 2, 4, ... for decode steps,
  // 0 for the rest.
  std::map<size_t, Totals> totals_;
};

}  // namespace ferry::cuda
