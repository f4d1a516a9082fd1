#include "engine/batch_engine.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace ferry::engine {

using Clock = std::chrono::steady_clock;

BatchEngine::BatchEngine(const model::Model& model, const text::Tokenizer& tok,
                         const kernels::Context& ctx, size_t max_batch, kernels::KvFormat k,
                         kernels::KvFormat v)
    : model_(model),
      tok_(tok),
      ctx_(ctx),
      max_batch_(std::max<size_t>(1, max_batch)),
      spec_(model.config().kv_spec(k, v)),
      batch_(spec_, model_.kv_allocator()) {}

size_t BatchEngine::submit(const GenerationRequest& req, Sequence::OnText on_text) {
  auto seq =
      std::make_unique<Sequence>(req, tok_, model_.config().context_length, std::move(on_text));
  waiting_.push_back(Item{next_id_, std::move(seq)});
  return next_id_++;
}

kv::BatchKv BatchEngine::prefill(Item& item) {
  const auto t0 = Clock::now();
  const std::vector<int32_t>& prompt = item.seq->request().prompt;
  kv::BatchKv solo(spec_, model_.kv_allocator());
  const size_t len = prompt.size();
  solo.prepare_prefill(std::span<const size_t>(&len, 1));
  std::vector<float> logits;
  const size_t chunk = std::max<size_t>(1, item.seq->request().prefill_chunk);
  for (size_t i = 0; i < len; i += chunk) {
    model::RowInput in{std::span<const int32_t>(prompt).subspan(i, std::min(chunk, len - i)),
                       false};
    model_.forward(ctx_, solo, std::span<const model::RowInput>(&in, 1), logits);
  }
  solo.finalize_prefill();
  item.seq->result().prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  item.seq->on_logits(logits);
  return solo;
}

void BatchEngine::decode_step() {
  const auto t0 = Clock::now();
  std::vector<int32_t> feed(running_.size());
  std::vector<model::RowInput> rows(running_.size());
  for (size_t b = 0; b < running_.size(); ++b) {
    feed[b] = running_[b].seq->last_token();
    rows[b] = model::RowInput{std::span<const int32_t>(&feed[b], 1), false};
  }
  std::vector<float> logits;
  model_.forward(ctx_, batch_, rows, logits);
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  const size_t V = model_.config().vocab_size;
  std::vector<size_t> keep;
  for (size_t b = 0; b < running_.size(); ++b) {
    Sequence& s = *running_[b].seq;
    s.result().decode_seconds += dt;
    if (!s.on_logits(std::span<float>(&logits[b * V], V))) keep.push_back(b);
  }
  if (keep.size() == running_.size()) return;
  batch_.filter(keep);
  std::vector<Item> next;
  for (size_t b = 0, k = 0; b < running_.size(); ++b) {
    if (k < keep.size() && keep[k] == b) {
      next.push_back(std::move(running_[b]));
      ++k;
    } else {
      on_done_(running_[b].id, std::move(running_[b].seq->result()));
    }
  }
  running_ = std::move(next);
}

void BatchEngine::run(const std::function<void(size_t, GenerationResult&&)>& on_done) {
  on_done_ = on_done;
  while (!waiting_.empty() || !running_.empty()) {
    while (running_.size() < max_batch_ && !waiting_.empty()) {
      Item item = std::move(waiting_.front());
      waiting_.pop_front();
      if (item.seq->finished()) {  // a zero budget
        on_done_(item.id, std::move(item.seq->result()));
        continue;
      }
      kv::BatchKv solo = prefill(item);
      if (item.seq->finished()) {
        on_done_(item.id, std::move(item.seq->result()));
        continue;
      }
      if (running_.empty()) {
        batch_ = std::move(solo);
      } else {
        batch_.extend(solo);
      }
      running_.push_back(std::move(item));
    }
    peak_batch_ = std::max(peak_batch_, running_.size());
    peak_kv_bytes_ = std::max(peak_kv_bytes_, batch_.allocated_bytes());
    if (!running_.empty()) decode_step();
  }
}

}  // namespace ferry::engine
