// One HTTP request's choices in the scheduler, from submission to their
// last event.
//
// Threading: the scheduler calls each choice's sink on its engine thread;
// the sink only appends to this request's queue under a mutex and signals a
// condition variable, so a slow or stalled client never blocks the engine
// loop. The connection's thread drains the queue (wait()). The queue is
// shared with the sinks, so it outlives the Generation if the engine still
// holds a sink.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/scheduler.h"
#include "server/openai_api.h"

namespace ferry::server {

// The scheduler's submit() errors as API errors: "[admission] ... shutting
// down" is 503, other admission, generate and sampling errors are 400,
// anything else 500.
ApiError api_error_from(const Error& e);

class Generation {
 public:
  struct Item {
    size_t choice;
    engine::StreamEvent event;
  };

  explicit Generation(engine::Scheduler& scheduler) : sched_(scheduler) {}
  // Cancels every choice that has not ended: the client went away or the
  // answer failed halfway.
  ~Generation() { cancel(); }
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // Submits every choice of the plan (each choice's index is its position).
  // If one is refused, those already submitted are cancelled and the
  // refusal is thrown as an ApiError.
  void submit(const Plan& plan, size_t top_logprobs);
  // Moves the queued events into `out` (cleared first), waiting up to
  // `timeout` while there are none. Choices whose last event is taken are
  // marked ended.
  void wait(std::vector<Item>& out, std::chrono::milliseconds timeout);
  // Cancels the choices that have not ended; they get no more events.
  void cancel();

 private:
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Item> items;
  };

  engine::Scheduler& sched_;
  std::shared_ptr<Queue> queue_ = std::make_shared<Queue>();
  std::vector<uint64_t> ids_;
  std::vector<bool> open_;
};

}  // namespace ferry::server
