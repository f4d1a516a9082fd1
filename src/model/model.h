// The model seam: one forward step over a batch of rows, each row a
// sequence with its own new tokens, positions and cache. Architectures
// implement it (model/llama.cpp); the engine never sees tensor names.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/ops.h"
#include "kv/batch_kv.h"
#include "model/backend.h"
#include "model/outputs.h"

namespace ferry::model {

struct ModelConfig {
  std::string arch;
  std::string name;
  size_t n_layers = 0;
  size_t n_embd = 0;
  size_t n_ff = 0;
  size_t n_heads = 0;
  size_t n_kv_heads = 0;
  size_t head_dim = 0;
  size_t vocab_size = 0;
  size_t context_length = 0;
  float rms_eps = 1e-5f;
  float rope_base = 10000.0f;
  // head_dim / 2 inverse frequencies with any rope scaling folded in.
  std::vector<float> rope_inv_freq;
  size_t sliding_window = 0;  // 0: every layer attends to the whole context
  // The KV layout of this model with the given storage formats.
  kv::KvSpec kv_spec(kernels::KvFormat k = kernels::KvFormat::f32(),
                     kernels::KvFormat v = kernels::KvFormat::f32()) const;
};

// The new tokens of one cache row in a step. They are appended after the
// row's cached tokens (positions continue from the row's length). A row
// with no tokens sits the step out. If all_logits, the row contributes one
// logits vector per token, else one for its last token (none when
// want_logits is false).
struct RowInput {
  std::span<const int32_t> tokens;
  bool all_logits = false;
  bool want_logits = true;  // false: no output for this row (a prefill chunk mid-prompt)
};

using LoadProgress = std::function<void(double fraction)>;

class Model {
 public:
  virtual ~Model() = default;
  const ModelConfig& config() const { return config_; }
  const gguf::File& file() const { return *file_; }

  // Runs one step over every row of `kv` (rows[b] feeds cache row b).
  // logits is resized to [n_outputs, vocab_size], rows' outputs in order.
  // Each output depends only on its own row's tokens and cache (see
  // kernels/ops.h), so batching never changes a row's logits. On an error
  // the cache is left as it was.
  void forward(const kernels::Context& ctx, kv::BatchKv& kv, std::span<const RowInput> rows,
               std::vector<float>& logits) const;
  // The same step, delivering per output what needs[o] asks for (empty
  // needs: every output's whole row); see model/outputs.h. `out` is
  // reused across steps.
  virtual void step(const kernels::Context& ctx, kv::BatchKv& kv, std::span<const RowInput> rows,
                    std::span<const OutputNeed> needs, StepOutputs& out) const = 0;
  // The number of outputs a step over `rows` produces.
  static size_t count_outputs(std::span<const RowInput> rows);

  // Moves the model to a backend (model/backend.h), e.g. a GPU: its
  // weights are copied into the backend's memory now, and every later
  // forward runs there (ctx is then unused). Without it, forward runs on
  // the CPU with ctx's threads. Call before any cache exists.
  virtual void set_backend(std::unique_ptr<Backend> backend) = 0;
  // Where caches for this model must keep their bytes (the backend's).
  std::shared_ptr<kv::KvAllocator> kv_allocator() const {
    return backend_ ? backend_->kv_allocator() : kv::KvAllocator::standard();
  }
  // "cpu", or the backend's name.
  std::string device() const { return backend_ ? backend_->name() : "cpu"; }

 protected:
  ModelConfig config_;
  std::unique_ptr<gguf::File> file_;
  std::unique_ptr<Backend> backend_;
};

// Opens a GGUF model, picks its architecture, validates every tensor and
// pre-faults the weights, reporting progress. Throws ferry::Error.
std::unique_ptr<Model> load_model(const std::string& path, const LoadProgress& progress = {});

}  // namespace ferry::model
