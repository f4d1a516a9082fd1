// Llama-family architecture: SmolLM2, Llama 2/3, Mistral-style files.
// Pre-norm decoder: RMSNorm → GQA attention with RoPE → residual → RMSNorm
// → SwiGLU MLP → residual; final RMSNorm; tied or separate output head.
// Tensor names are GGUF's llama names; Q/K rows use GGML's adjacent-pair
// RoPE layout (converters permute HF weights into it).
#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
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
    tok_embd_ = weight(f, "token_embd.weight", c.n_embd, c.vocab_size);
    output_ = f.find_tensor("output.weight") ? weight(f, "output.weight", c.n_embd, c.vocab_size)
                                             : tok_embd_;
    output_norm_ = vector_f32(f, "output_norm.weight", c.n_embd);
    for (size_t l = 0; l < c.n_layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      layers_.push_back(LayerWeights{
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

  void forward(const kernels::Context& ctx, kv::BatchKv& kv, std::span<const RowInput> rows,
               std::vector<float>& logits) const override;

 private:
  kernels::WeightView tok_embd_, output_;
  const float* output_norm_ = nullptr;
  std::vector<LayerWeights> layers_;
};

void LlamaModel::forward(const kernels::Context& ctx, kv::BatchKv& kv,
                         std::span<const RowInput> rows, std::vector<float>& logits) const {
  const ModelConfig& c = config_;
  const size_t E = c.n_embd, D = c.head_dim, H = c.n_heads, KVH = c.n_kv_heads;
  const size_t q_dim = H * D, kv_dim = KVH * D;
  if (rows.size() != kv.rows())
    fail("forward", rows.size(), " row inputs for a cache of ", kv.rows(), " rows");

  // Flatten the rows' new tokens into T token rows; remember each token's
  // cache row, index within the step and position.
  std::vector<int32_t> tokens;
  std::vector<size_t> tok_row, tok_i, tok_pos, counts(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    counts[r] = rows[r].tokens.size();
    const size_t len = kv.table().row(r).length();
    if (len + counts[r] > c.context_length)
      fail("forward", "row ", r, " would hold ", len + counts[r], " tokens, over the context of ",
           c.context_length);
    for (size_t i = 0; i < counts[r]; ++i) {
      tokens.push_back(rows[r].tokens[i]);
      tok_row.push_back(r);
      tok_i.push_back(i);
      tok_pos.push_back(len + i);
    }
  }
  const size_t T = tokens.size();
  logits.clear();
  if (T == 0) return;
  kv.reserve(counts);  // the step's only cache allocation; nothing changes on failure
  std::vector<float> x(T * E), xn(T * E), q(T * q_dim), k(T * kv_dim), v(T * kv_dim);
  std::vector<float> attn(T * q_dim), tmp(T * E), gate(T * c.n_ff), up(T * c.n_ff);
  kernels::embed(tok_embd_, tokens, x.data());

  const kernels::AttentionShape shape{H, KVH, D, 1.0f / std::sqrt(static_cast<float>(D))};
  std::vector<kernels::AttentionTask> tasks(T);
  std::vector<kernels::KvSide> sides(2 * T);
  for (size_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = layers_[l];
    kernels::rmsnorm(ctx, x.data(), w.attn_norm, T, E, c.rms_eps, xn.data());
    kernels::matmul(ctx, w.wq, xn.data(), T, q.data());
    kernels::matmul(ctx, w.wk, xn.data(), T, k.data());
    kernels::matmul(ctx, w.wv, xn.data(), T, v.data());
    for (size_t t = 0; t < T; ++t) {
      const int64_t pos = static_cast<int64_t>(tok_pos[t]);
      kernels::rope(&q[t * q_dim], H, D, pos, c.rope_inv_freq.data());
      kernels::rope(&k[t * kv_dim], KVH, D, pos, c.rope_inv_freq.data());
      kv.write(l, tok_row[t], tok_i[t], &k[t * kv_dim], &v[t * kv_dim]);
    }
    for (size_t t = 0; t < T; ++t) {
      tasks[t] = kv.attention_task(l, tok_row[t], tok_i[t], &sides[2 * t], &sides[2 * t + 1]);
      tasks[t].q = &q[t * q_dim];
      tasks[t].out = &attn[t * q_dim];
    }
    kernels::attention(ctx, shape, tasks);
    kernels::matmul(ctx, w.wo, attn.data(), T, tmp.data());
    kernels::add_inplace(x.data(), tmp.data(), T * E);

    kernels::rmsnorm(ctx, x.data(), w.ffn_norm, T, E, c.rms_eps, xn.data());
    kernels::matmul(ctx, w.w_gate, xn.data(), T, gate.data());
    kernels::matmul(ctx, w.w_up, xn.data(), T, up.data());
    kernels::silu_mul(gate.data(), up.data(), T * c.n_ff);
    kernels::matmul(ctx, w.w_down, gate.data(), T, tmp.data());
    kernels::add_inplace(x.data(), tmp.data(), T * E);
  }

  // Gather the token rows that produce logits.
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
  std::vector<float> sel(out_tokens.size() * E);
  for (size_t i = 0; i < out_tokens.size(); ++i) std::copy_n(&x[out_tokens[i] * E], E, &sel[i * E]);
  kernels::rmsnorm(ctx, sel.data(), output_norm_, out_tokens.size(), E, c.rms_eps, sel.data());
  logits.resize(out_tokens.size() * c.vocab_size);
  kernels::matmul(ctx, output_, sel.data(), out_tokens.size(), logits.data());
  kv.commit(counts);  // last: an exception above leaves the rows' lengths as they were
}

}  // namespace

std::unique_ptr<Model> load_model(const std::string& path, const LoadProgress& progress) {
  std::unique_ptr<gguf::File> f = gguf::File::open(path);
  std::string arch = f->get_string("general.architecture");
  if (arch != "llama" && arch != "mistral")
    fail("model", path, ": architecture '", arch, "' is not supported (supported: llama, mistral)");
  prefault(*f, progress);
  return std::make_unique<LlamaModel>(std::move(f), arch);
}

}  // namespace ferry::model
