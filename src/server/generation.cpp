#include "server/generation.h"

#include <string_view>

namespace ferry::server {

ApiError api_error_from(const Error& e) {
  const std::string_view msg = e.what();
  if (msg.starts_with("[admission]") && msg.find("shutting down") != std::string_view::npos)
    return ApiError(503, "server_error", e.what(), {}, "server_shutting_down");
  if (msg.starts_with("[admission]"))
    return invalid_request(e.what(), "max_tokens", "kv_budget_exceeded");
  if (msg.starts_with("[generate]") || msg.starts_with("[sampling]"))
    return invalid_request(e.what(), {}, "invalid_value");
  return ApiError(500, "server_error", e.what());
}

void Generation::submit(const Plan& plan, size_t top_logprobs) {
  ids_.reserve(plan.choices.size());
  for (size_t i = 0; i < plan.choices.size(); ++i) {
    auto sink = [q = queue_, i](const engine::StreamEvent& ev) {
      {
        std::lock_guard<std::mutex> lock(q->mu);
        q->items.push_back({i, ev});
      }
      q->cv.notify_one();
    };
    try {
      ids_.push_back(sched_.submit(plan.choices[i], std::move(sink), top_logprobs));
      open_.push_back(true);
    } catch (const Error& e) {
      cancel();
      throw api_error_from(e);
    }
  }
}

void Generation::wait(std::vector<Item>& out, std::chrono::milliseconds timeout) {
  out.clear();
  {
    std::unique_lock<std::mutex> lock(queue_->mu);
    queue_->cv.wait_for(lock, timeout, [&] { return !queue_->items.empty(); });
    out.swap(queue_->items);
  }
  for (const Item& it : out)
    if (it.event.kind != engine::StreamEvent::Kind::Token && it.choice < open_.size())
      open_[it.choice] = false;
}

void Generation::cancel() {
  for (size_t i = 0; i < ids_.size(); ++i) {
    if (!open_[i]) continue;
    sched_.cancel(ids_[i]);
    open_[i] = false;
  }
}

}  // namespace ferry::server
