// Llama-family architecture: SmolLM2, Llama 2/3, Mistral-style files.
// Pre-norm decoder: RMSNorm → GQA attention with RoPE → residual → RMSNorm
// → SwiGLU MLP → residual; final RMSNorm; tied or separate output head.
// Tensor names are GGUF's llama names; Q/K rows use GGML's adjacent-pair
// RoPE layout (converters permute HF weights into it).
#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "model/backend.h"
#include "model/loader.h"
#include "model/model.h"

namespace ferry::model {

namespace {

struct LayerWeights {
  const float* attn_norm;
  kernels::WeightView wq, wk, wv, wo;
  const float* ffn_norm;
  kernels::WeightView w_gate, w_up, w_down;
};

// Every tensor the forward reads, as views into one backend's memory.
struct LlamaWeights {
  kernels::WeightView tok_embd, output;
  const float* output_norm = nullptr;
  const float* rope_inv_freq = nullptr;
  std::vector<LayerWeights> layers;
};

class LlamaModel final : public Model {
 public:
  LlamaModel(std::unique_ptr<gguf::File> file, const std::string& arch) {
    file_ = std::move(file);
    const gguf::File& f = *file_;
    config_ = read_llama_config(f, arch);
    const ModelConfig& c = config_;
    const size_t q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
    const gguf::TensorInfo& emb = f.tensor("token_embd.weight");
    if (c.vocab_size == 0 && emb.shape.size() == 2) config_.vocab_size = emb.shape[1];
    LlamaWeights& w = host_;
    w.tok_embd = weight(f, "token_embd.weight", c.n_embd, c.vocab_size);
    w.output = f.find_tensor("output.weight") ? weight(f, "output.weight", c.n_embd, c.vocab_size)
                                              : w.tok_embd;
    w.output_norm = vector_f32(f, "output_norm.weight", c.n_embd);
    w.rope_inv_freq = config_.rope_inv_freq.data();
    for (size_t l = 0; l < c.n_layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      w.layers.push_back(LayerWeights{
          vector_f32(f, p + "attn_norm.weight", c.n_embd),
          weight(f, p + "attn_q.weight", c.n_embd, q_dim),
          weight(f, p + "attn_k.weight", c.n_embd, kv_dim),
          weight(f, p + "attn_v.weight", c.n_embd, kv_dim),
          weight(f, p + "attn_output.weight", q_dim, c.n_embd),
          vector_f32(f, p + "ffn_norm.weight", c.n_embd),
          weight(f, p + "ffn_gate.weight", c.n_embd, c.n_ff),
          weight(f, p + "ffn_up.weight", c.n_embd, c.n_ff),
          weight(f, p + "ffn_down.weight", c.n_ff, c.n_embd),
      });
      for (const char* bias : {"attn_q.bias", "attn_k.bias", "attn_v.bias"})
        if (f.find_tensor(p + bias))
          fail("model", f.path(), ": tensor '", p, bias,
               "': attention biases (Qwen2-style) are not supported by the llama architecture");
    }
  }

  void set_backend(std::unique_ptr<Backend> backend) override {
    const ModelConfig& c = config_;
    Backend& be = *backend;
    LlamaWeights d;
    d.tok_embd = be.weight(host_.tok_embd);
    d.output = host_.output.data == host_.tok_embd.data ? d.tok_embd : be.weight(host_.output);
    d.output_norm = be.vector(host_.output_norm, c.n_embd);
    d.rope_inv_freq = be.vector(host_.rope_inv_freq, c.head_dim / 2);
    for (const LayerWeights& h : host_.layers)
      d.layers.push_back(LayerWeights{
          be.vector(h.attn_norm, c.n_embd), be.layer_weight(h.wq), be.layer_weight(h.wk),
          be.layer_weight(h.wv), be.layer_weight(h.wo), be.vector(h.ffn_norm, c.n_embd),
          be.layer_weight(h.w_gate), be.layer_weight(h.w_up), be.layer_weight(h.w_down)});
    backend_ = std::move(backend);
    device_ = std::move(d);
  }

  void step(const kernels::Context& ctx, kv::BatchKv& kv, std::span<const RowInput> rows,
            std::span<const OutputNeed> needs, StepOutputs& out) const override {
    if (backend_) {
      FERRY_CHECK(kv.allocator() == backend_->kv_allocator(), "forward",
                  "the cache's memory is not the ", backend_->name(), " backend's");
      run(*backend_, device_, kv, rows, needs, out);
    } else {
      CpuBackend cpu(ctx);
      run(cpu, host_, kv, rows, needs, out);
    }
  }

 private:
  void run(Backend& be, const LlamaWeights& w, kv::BatchKv& kv, std::span<const RowInput> rows,
           std::span<const OutputNeed> needs, StepOutputs& out) const;

  LlamaWeights host_;
  // The weights in the memory of backend_ (set by set_backend; null: the
  // CPU, per call). forward() is const but drives the backend's stream and
  // arena: one forward at a time per model (the engine's one thread), as
  // for the CPU thread pool.
  LlamaWeights device_;
};

void LlamaModel::run(Backend& be, const LlamaWeights& w, kv::BatchKv& kv,
                     std::span<const RowInput> rows, std::span<const OutputNeed> needs,
                     StepOutputs& outputs) const {
  const ModelConfig& c = config_;
  const size_t E = c.n_embd, D = c.head_dim, H = c.n_heads, KVH = c.n_kv_heads;
  const size_t q_dim = H * D, kv_dim = KVH * D, F = c.n_ff;
  if (rows.size() != kv.rows())
    fail("forward", rows.size(), " row inputs for a cache of ", kv.rows(), " rows");

  // Flatten the rows' new tokens into T token rows; remember each token's
  // cache row, index within the step and position. Check ids here, on the
  // host, before any backend work.
  std::vector<int32_t> tokens, pos;
  std::vector<TokenPlace> places;
  std::vector<size_t> counts(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    counts[r] = rows[r].tokens.size();
    const size_t len = kv.table().row(r).length();
    if (len + counts[r] > c.context_length)
      fail("forward", "row ", r, " would hold ", len + counts[r], " tokens, over the context of ",
           c.context_length);
    for (size_t i = 0; i < counts[r]; ++i) {
      const int32_t t = rows[r].tokens[i];
      if (t < 0 || static_cast<size_t>(t) >= c.vocab_size)
        fail("embed", "token id ", t, " is outside the vocabulary of ", c.vocab_size);
      tokens.push_back(t);
      places.push_back({r, i});
      pos.push_back(static_cast<int32_t>(len + i));
    }
  }
  const size_t T = tokens.size();
  if (T == 0) {
    outputs.reset_full(0, c.vocab_size);
    return;
  }

  // The token rows that produce logits.
  std::vector<size_t> out_tokens;
  for (size_t t = 0, r = 0; r < rows.size(); ++r) {
    const size_t n = counts[r];
    if (n == 0) continue;
    if (!rows[r].want_logits) {
      // no output
    } else if (rows[r].all_logits) {
      for (size_t i = 0; i < n; ++i) out_tokens.push_back(t + i);
    } else {
      out_tokens.push_back(t + n - 1);
    }
    t += n;
  }
  const size_t n_out = out_tokens.size(), V = c.vocab_size;
  if (!needs.empty() && needs.size() != n_out)
    fail("forward", needs.size(), " output needs for a step of ", n_out, " outputs");

  kv.reserve(counts);  // the step's only cache allocation; nothing changes on failure
  const size_t sizes[] = {T * E, T * E, T * q_dim, T * kv_dim, T * kv_dim, T * q_dim,
                          T * E, T * F, T * F,     n_out * E,  n_out * V};
  float* buf[std::size(sizes)];
  be.activations(sizes, buf);
  float *x = buf[0], *xn = buf[1], *q = buf[2], *k = buf[3], *v = buf[4], *attn = buf[5];
  float *tmp = buf[6], *gate = buf[7], *up = buf[8], *sel = buf[9], *out = buf[10];
  be.embed(w.tok_embd, tokens, x);

  const kernels::AttentionShape shape{H, KVH, D, 1.0f / std::sqrt(static_cast<float>(D))};
  // Each residual add is fused with the norm that follows it (add_rmsnorm);
  // the first layer's input norm stands alone.
  if (c.n_layers > 0) be.rmsnorm(x, w.layers[0].attn_norm, T, E, c.rms_eps, xn);
  for (size_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    const kernels::WeightView qkv_w[] = {lw.wq, lw.wk, lw.wv};
    float* const qkv_y[] = {q, k, v};
    be.matmul_many(qkv_w, xn, T, qkv_y);
    be.rope(q, H, D, pos, w.rope_inv_freq);
    be.rope(k, KVH, D, pos, w.rope_inv_freq);
    be.kv_write(kv, l, places, k, v);
    be.attention(kv, l, places, shape, q, attn);
    be.matmul(lw.wo, attn, T, tmp);
    be.add_rmsnorm(x, tmp, lw.ffn_norm, T, E, c.rms_eps, xn);

    be.gate_up_silu(lw.w_gate, lw.w_up, xn, T, gate, up);
    be.matmul(lw.w_down, gate, T, tmp);
    if (l + 1 < c.n_layers)
      be.add_rmsnorm(x, tmp, w.layers[l + 1].attn_norm, T, E, c.rms_eps, xn);
    else
      be.add_inplace(x, tmp, T * E);
  }

  if (n_out > 0) {
    be.gather_rows(x, out_tokens, E, sel);
    be.rmsnorm(sel, w.output_norm, n_out, E, c.rms_eps, sel);
    be.matmul(w.output, sel, n_out, out);
  }
  be.outputs(out, n_out, V, needs, outputs);
  kv.commit(counts);  // last: an exception above leaves the rows' lengths as they were
}

}  // namespace

void Model::forward(const kernels::Context& ctx, kv::BatchKv& kv, std::span<const RowInput> rows,
                    std::vector<float>& logits) const {
  StepOutputs out;
  out.logits.swap(logits);  // reuse the caller's buffer
  step(ctx, kv, rows, {}, out);
  logits.swap(out.logits);
}

size_t Model::count_outputs(std::span<const RowInput> rows) {
  size_t n = 0;
  for (const RowInput& r : rows)
    if (r.want_logits && !r.tokens.empty()) n += r.all_logits ? r.tokens.size() : 1;
  return n;
}

std::unique_ptr<Model> load_model(const std::string& path, const LoadProgress& progress) {
  std::unique_ptr<gguf::File> f = gguf::File::open(path);
  std::string arch = f->get_string("general.architecture");
  if (arch != "llama" && arch != "mistral")
    fail("model", path, ": architecture '", arch, "' is not supported (supported: llama, mistral)");
  prefault(*f, progress);
  return std::make_unique<LlamaModel>(std::move(f), arch);
}

}  // namespace ferry::model
