// The op interface model code is written against, with the CPU and CUDA
// backends as peers (STYLE.md: "one contract per seam"). An architecture's
// forward (model/llama.cpp) calls these ops once; where the bytes live and
// which kernels run is the backend's business.
//
// Memory: weights are handed over once at load (`weight`, `vector`) and
// come back as views into the backend's memory; activations are float32
// buffers from `activations` (valid until the next call of it); the KV
// cache's bytes come from `kv_allocator()`. Every pointer an op takes is in
// the backend's memory unless marked "host".
//
// Determinism: every op keeps the promise of kernels/ops.h: each output
// element is reduced in one fixed order that depends only on its own
// inputs, so a row's results never depend on the other rows of the step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kernels/ops.h"
#include "kv/batch_kv.h"
#include "model/outputs.h"

namespace ferry::model {

// Step token t's place: cache row, index within the row's new tokens.
struct TokenPlace {
  size_t row = 0, i = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // --- memory ---
  // A weight for this backend (host: the mapped GGUF bytes, used in place).
  virtual kernels::WeightView weight(const kernels::WeightView& host) = 0;
  // A weight that only a layer's products read (Q/K/V, o, gate, up, down;
  // not the embedding table or the output head). A backend may store these
  // in a format of its own (the CUDA backend's --fp8); the default is
  // weight().
  virtual kernels::WeightView layer_weight(const kernels::WeightView& host) { return weight(host); }
  // n floats copied (or, on the CPU, referenced) into backend memory.
  virtual const float* vector(const float* host, size_t n) = 0;
  // Where KV caches for this backend keep their bytes.
  virtual std::shared_ptr<kv::KvAllocator> kv_allocator() const = 0;
  // `n` float32 buffers of sizes[i] floats each, written to out[i]. Valid
  // until the next call (a backend reuses one arena: no per-step
  // allocation once the largest step has been seen).
  virtual void activations(std::span<const size_t> sizes, std::span<float*> out) = 0;

  // --- ops (shapes as in kernels/ops.h; "rows" are the step's tokens) ---
  virtual void embed(const kernels::WeightView& table, std::span<const int32_t> host_tokens,
                     float* out) = 0;
  virtual void rmsnorm(const float* x, const float* w, size_t n_rows, size_t dim, float eps,
                       float* out) = 0;
  virtual void matmul(const kernels::WeightView& w, const float* x, size_t n_rows, float* y) = 0;
  // y[i] = matmul(w[i], x) for weights with the same n_in (Q/K/V, gate/up):
  // each y[i] bit-identical to the separate call. A backend may run them as
  // one launch over all their output columns; this default loops.
  virtual void matmul_many(std::span<const kernels::WeightView> w, const float* x, size_t n_rows,
                           std::span<float* const> y) {
    for (size_t i = 0; i < w.size(); ++i) matmul(w[i], x, n_rows, y[i]);
  }
  // Rotates the heads of token row t at position host_pos[t].
  virtual void rope(float* x, size_t n_heads, size_t head_dim, std::span<const int32_t> host_pos,
                    const float* inv_freq) = 0;
  virtual void silu_mul(float* gate, const float* up, size_t n) = 0;
  // The FFN's SwiGLU input: gate = silu(x w_gate^T) * (x w_up^T) for n_rows
  // rows of x, with `up` (gate's size) as scratch. A backend may fuse the
  // products and the gating; the results are those of the two calls below.
  virtual void gate_up_silu(const kernels::WeightView& w_gate, const kernels::WeightView& w_up,
                            const float* x, size_t n_rows, float* gate, float* up) {
    const kernels::WeightView w[] = {w_gate, w_up};
    float* const y[] = {gate, up};
    matmul_many(w, x, n_rows, y);
    silu_mul(gate, up, n_rows * w_gate.n_out);
  }
  virtual void add_inplace(float* x, const float* y, size_t n) = 0;
  // x += y, then rmsnorm(x) into out (a residual add and the next norm): a
  // backend may fuse them; the results are those of the two calls.
  virtual void add_rmsnorm(float* x, const float* y, const float* w, size_t n_rows, size_t dim,
                           float eps, float* out) {
    add_inplace(x, y, n_rows * dim);
    rmsnorm(x, w, n_rows, dim, eps, out);
  }
  // out[i, :] = x[host_rows[i], :] for rows of `dim` floats.
  virtual void gather_rows(const float* x, std::span<const size_t> host_rows, size_t dim,
                           float* out) = 0;

  // Writes token t's K and V rows (k + t * kv_dim, v + t * kv_dim) into
  // `layer` of the cache at places[t] (after kv.reserve for the step).
  virtual void kv_write(kv::BatchKv& kv, size_t layer, std::span<const TokenPlace> places,
                        const float* k, const float* v) = 0;
  // out[t] = attention of q[t] over the keys token places[t] may see in
  // `layer` (BatchKv::attention_task), q/out: [T, n_heads * head_dim].
  virtual void attention(const kv::BatchKv& kv, size_t layer, std::span<const TokenPlace> places,
                         const kernels::AttentionShape& shape, const float* q, float* out) = 0;

  // Copies n floats of backend memory to the host (waits for the step's
  // work before returning).
  virtual void to_host(const float* x, size_t n, float* host_out) = 0;
  // Hands the step's logits ([n_out, vocab] in backend memory) to the host
  // as `needs` asks (empty: all whole rows), into `out` (model/outputs.h;
  // waits for the step's work). This default copies every whole row.
  virtual void outputs(const float* logits, size_t n_out, size_t vocab,
                       std::span<const OutputNeed> needs, StepOutputs& out) {
    (void)needs;
    out.reset_full(n_out, vocab);
    to_host(logits, n_out * vocab, out.logits.data());
  }
};

// The CPU backend for one call: ops run on ctx's pool and kernel path.
// Weights and vectors are used in place. The activation arena and the
// attention task lists belong to the calling thread (thread_local), not to
// the object, so a backend made per forward call still allocates nothing
// once the thread has seen its largest step; `activations` buffers are
// valid until the thread's next `activations` call by any CpuBackend (one
// forward at a time per thread, as for the pool).
class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const kernels::Context& ctx);
  std::string name() const override { return "cpu"; }
  kernels::WeightView weight(const kernels::WeightView& host) override { return host; }
  const float* vector(const float* host, size_t) override { return host; }
  std::shared_ptr<kv::KvAllocator> kv_allocator() const override {
    return kv::KvAllocator::standard();
  }
  void activations(std::span<const size_t> sizes, std::span<float*> out) override;
  void embed(const kernels::WeightView& table, std::span<const int32_t> host_tokens,
             float* out) override;
  void rmsnorm(const float* x, const float* w, size_t n_rows, size_t dim, float eps,
               float* out) override;
  void matmul(const kernels::WeightView& w, const float* x, size_t n_rows, float* y) override;
  void matmul_many(std::span<const kernels::WeightView> w, const float* x, size_t n_rows,
                   std::span<float* const> y) override;
  void rope(float* x, size_t n_heads, size_t head_dim, std::span<const int32_t> host_pos,
            const float* inv_freq) override;
  void silu_mul(float* gate, const float* up, size_t n) override;
  void add_inplace(float* x, const float* y, size_t n) override;
  void gather_rows(const float* x, std::span<const size_t> host_rows, size_t dim,
                   float* out) override;
  void kv_write(kv::BatchKv& kv, size_t layer, std::span<const TokenPlace> places, const float* k,
                const float* v) override;
  void attention(const kv::BatchKv& kv, size_t layer, std::span<const TokenPlace> places,
                 const kernels::AttentionShape& shape, const float* q, float* out) override;
  void to_host(const float* x, size_t n, float* host_out) override;

 private:
  struct Scratch {
    std::vector<float> arena;
    std::vector<kernels::AttentionTask> tasks;
    std::vector<kernels::KvSide> sides;
  };
  kernels::Context ctx_;
  Scratch& scratch_;  // this thread's
};

}  // namespace ferry::model
