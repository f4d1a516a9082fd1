#include "cuda/step_profile.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ferry::cuda {

bool StepProfile::requested() {
  const char* v = std::getenv("FERRY_CUDA_PROFILE");
  return v && *v && std::strcmp(v, "0") != 0;
}

cudaEvent_t StepProfile::event(size_t i) {
  while (events_.size() <= i) {
    cudaEvent_t e = nullptr;
    cudaEventCreate(&e);
    events_.push_back(e);
  }
  return events_[i];
}

void StepProfile::begin_step() {
  const Clock::time_point now = Clock::now();
  between_ = t_end_ == Clock::time_point{} ? 0.0 : std::chrono::duration<double>(now - t_end_).count();
  between_sync_ = t_end_ == Clock::time_point{} || t_open_ < t_end_
                      ? 0.0
                      : std::chrono::duration<double>(now - t_open_).count();
  t_begin_ = now;
  tokens_ = outputs_ = 0;
  names_.clear();
  cudaEventRecord(event(0), stream_);
  open_ = true;
}

void StepProfile::mark(const char* op) {
  if (!open_) return;
  names_.push_back(op);
  cudaEventRecord(event(names_.size()), stream_);
}

void StepProfile::before_wait() {
  if (!open_) return;
  t_wait_ = Clock::now();
  names_.push_back("outputs");
  cudaEventRecord(event(names_.size()), stream_);
}

void StepProfile::end_step() {
  if (!open_) return;
  open_ = false;
  const size_t last = names_.size() + 1;
  cudaEventRecord(event(last), stream_);
  cudaEventSynchronize(event(last));
  t_end_ = Clock::now();
  size_t group = 0;  // the rest
  if (tokens_ == outputs_)
    for (group = 1; group < tokens_;) group *= 2;
  Totals& t = totals_[group];
  ++t.steps;
  t.tokens += tokens_;
  t.between += between_;
  t.between_sync += between_sync_;
  t.between_max = std::max(t.between_max, between_);
  t.build += std::chrono::duration<double>(t_wait_ - t_begin_).count();
  t.wait += std::chrono::duration<double>(t_end_ - t_wait_).count();
  float ms = 0;
  cudaEventElapsedTime(&ms, event(0), event(last));
  t.device += ms / 1e3;
  for (size_t i = 0; i < names_.size(); ++i) {
    cudaEventElapsedTime(&ms, event(i + 1), event(i + 2));
    t.ops[names_[i]] += ms / 1e3;
  }
}

StepProfile::~StepProfile() {
  for (const auto& [group, t] : totals_) {
    const double n = static_cast<double>(t.steps);
    const std::string name = group == 0   ? "other steps"
                             : group == 1 ? "decode steps of 1 row"
                             : group == 2 ? "decode steps of 2 rows"
                                          : "decode steps of " + std::to_string(group / 2 + 1) +
                                                "-" + std::to_string(group) + " rows";
    std::fprintf(stderr,
                 "[cuda profile] %s: %zu steps, %.1f tokens/step; per step ms: host build %.3f, "
                 "wait %.3f, between steps %.3f (of which waiting for device work enqueued "
                 "between steps %.3f; longest gap %.3f), device span %.3f\n",
                 name.c_str(), t.steps, static_cast<double>(t.tokens) / n, 1e3 * t.build / n,
                 1e3 * t.wait / n, 1e3 * t.between / n, 1e3 * t.between_sync / n,
                 1e3 * t.between_max, 1e3 * t.device / n);
    for (const auto& [op, s] : t.ops)
      std::fprintf(stderr, "[cuda profile]   %-12s %8.3f ms/step\n", op.c_str(), 1e3 * s / n);
  }
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

}  // namespace ferry::cuda
