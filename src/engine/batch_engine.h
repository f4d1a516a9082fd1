// BatchEngine: offline continuous batching. Requests join the running batch
// as others finish (each newcomer is prefilled alone, in chunks, then its
// cache row joins the batch with BatchKv::extend) and leave it when done
// (BatchKv::filter). Every running row advances one token per step.
//
// Rows never influence each other's logits (docs/KERNELS.md), so a
// request's output is the same for any max_batch: max_batch 1 is the solo
// run.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "engine/generate.h"
#include "engine/sequence.h"
#include "kv/batch_kv.h"

namespace ferry::engine {

class BatchEngine {
 public:
  BatchEngine(const model::Model& model, const text::Tokenizer& tok, const kernels::Context& ctx,
              size_t max_batch, kernels::KvFormat k = kernels::KvFormat::f32(),
              kernels::KvFormat v = kernels::KvFormat::f32());

  // Queues a request (validated now; throws ferry::Error). Returns its id,
  // counting from 0 in submission order.
  size_t submit(const GenerationRequest& req, Sequence::OnText on_text = {});
  // Runs until every queued request has finished, calling on_done(id,
  // result) as each one does.
  void run(const std::function<void(size_t, GenerationResult&&)>& on_done);

  // Peak number of rows that ran together, and peak KV bytes allocated.
  size_t peak_batch() const { return peak_batch_; }
  size_t peak_kv_bytes() const { return peak_kv_bytes_; }

 private:
  struct Item {
    size_t id;
    std::unique_ptr<Sequence> seq;
  };
  // Prefills a newcomer alone; returns its one-row cache.
  kv::BatchKv prefill(Item& item);
  void decode_step();

  const model::Model& model_;
  const text::Tokenizer& tok_;
  kernels::Context ctx_;
  size_t max_batch_;
  kv::KvSpec spec_;
  std::deque<Item> waiting_;
  std::vector<Item> running_;  // running_[b] is cache row b
  kv::BatchKv batch_;
  size_t next_id_ = 0;
  size_t peak_batch_ = 0, peak_kv_bytes_ = 0;
  std::function<void(size_t, GenerationResult&&)> on_done_;
};

}  // namespace ferry::engine
