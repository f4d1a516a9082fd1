#include "model/loader.h"

#include <sys/mman.h>

#include <cmath>

#include "core/error.h"

namespace ferry::model {

kv::KvSpec ModelConfig::kv_spec(kernels::KvFormat k, kernels::KvFormat v) const {
  kv::KvSpec s = kv::KvSpec::uniform(n_layers, n_kv_heads, head_dim, k, v);
  for (auto& l : s.layers) l.window = sliding_window;
  return s;
}

ModelConfig read_llama_config(const gguf::File& f, const std::string& arch) {
  ModelConfig c;
  auto key = [&](const char* k) { return arch + "." + k; };
  c.arch = arch;
  c.name = f.get_string("general.name", std::string("unnamed"));
  c.n_layers = static_cast<size_t>(f.get_int(key("block_count")));
  c.n_embd = static_cast<size_t>(f.get_int(key("embedding_length")));
  c.n_ff = static_cast<size_t>(f.get_int(key("feed_forward_length")));
  c.n_heads = static_cast<size_t>(f.get_int(key("attention.head_count")));
  c.n_kv_heads = static_cast<size_t>(
      f.get_int(key("attention.head_count_kv"), static_cast<int64_t>(c.n_heads)));
  c.context_length = static_cast<size_t>(f.get_int(key("context_length"), 2048));
  c.rms_eps = static_cast<float>(f.get_float(key("attention.layer_norm_rms_epsilon"), 1e-5));
  c.rope_base = static_cast<float>(f.get_float(key("rope.freq_base"), 10000.0));
  c.sliding_window = static_cast<size_t>(f.get_int(key("attention.sliding_window"), 0));
  auto bad = [&](const std::string& what) { fail("model", f.path(), ": ", what); };
  if (c.n_layers == 0 || c.n_embd == 0 || c.n_heads == 0 || c.n_kv_heads == 0 || c.n_ff == 0)
    bad("zero-sized hyperparameter");
  if (c.n_heads % c.n_kv_heads != 0) bad("head_count is not a multiple of head_count_kv");
  c.head_dim = static_cast<size_t>(
      f.get_int(key("attention.key_length"), static_cast<int64_t>(c.n_embd / c.n_heads)));
  if (c.head_dim % 16 != 0 || c.n_embd % 16 != 0 || c.n_ff % 16 != 0)
    bad("dimensions must be multiples of 16 (head_dim " + std::to_string(c.head_dim) + ")");
  int64_t rot = f.get_int(key("rope.dimension_count"), static_cast<int64_t>(c.head_dim));
  if (static_cast<size_t>(rot) != c.head_dim)
    bad("partial rotary embeddings (rope.dimension_count " + std::to_string(rot) +
        " != head_dim) are not supported");
  if (const auto* tok = f.find("tokenizer.ggml.tokens")) {
    c.vocab_size = tok->as_array("tokenizer.ggml.tokens").items.size();
  }
  c.vocab_size =
      static_cast<size_t>(f.get_int(key("vocab_size"), static_cast<int64_t>(c.vocab_size)));

  // Inverse frequencies: base^(-2i/d), computed in double and rounded once.
  const size_t half = c.head_dim / 2;
  c.rope_inv_freq.resize(half);
  for (size_t i = 0; i < half; ++i)
    c.rope_inv_freq[i] = static_cast<float>(
        1.0 / std::pow(static_cast<double>(c.rope_base),
                       static_cast<double>(2 * i) / static_cast<double>(c.head_dim)));
  std::string scaling = f.get_string(key("rope.scaling.type"), std::string("none"));
  if (scaling == "linear") {
    float factor = static_cast<float>(f.get_float(key("rope.scaling.factor"), 1.0));
    for (float& v : c.rope_inv_freq) v /= factor;
  } else if (scaling != "none" && scaling != "llama3") {
    bad("rope scaling '" + scaling + "' is not supported");
  }
  // Llama 3 scaling is stored by converters as per-pair divisors.
  if (f.find_tensor("rope_freqs.weight")) {
    const float* factors = vector_f32(f, "rope_freqs.weight", half);
    for (size_t i = 0; i < half; ++i) c.rope_inv_freq[i] /= factors[i];
  }
  return c;
}

static std::string shape_str(const std::vector<uint64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

kernels::WeightView weight(const gguf::File& f, const std::string& name, size_t n_in,
                           size_t n_out) {
  const gguf::TensorInfo& t = f.tensor(name);
  bool ok = (t.shape.size() == 2 && t.shape[0] == n_in && t.shape[1] == n_out) ||
            (t.shape.size() == 1 && n_out == 1 && t.shape[0] == n_in);
  if (!ok)
    fail("model", f.path(), ": tensor '", name, "' has shape ", shape_str(t.shape), ", expected [",
         n_in, ", ", n_out, "]");
  return kernels::WeightView{t.type, t.data, n_in, n_out};
}

const float* vector_f32(const gguf::File& f, const std::string& name, size_t n) {
  const gguf::TensorInfo& t = f.tensor(name);
  if (t.type != DType::F32 || t.n_elements() != n)
    fail("model", f.path(), ": tensor '", name, "' must be F32 with ", n, " elements, is ",
         dtype_traits(t.type).name, " ", shape_str(t.shape));
  if (reinterpret_cast<uintptr_t>(t.data) % alignof(float) != 0)
    fail("model", f.path(), ": tensor '", name, "' is misaligned");
  return reinterpret_cast<const float*>(t.data);
}

void prefault(const gguf::File& f, const LoadProgress& progress) {
  size_t total = 0, done = 0;
  for (const auto& t : f.tensors()) total += t.n_bytes;
  volatile uint8_t sink = 0;
  for (const auto& t : f.tensors()) {
    for (size_t off = 0; off < t.n_bytes; off += 4096) sink = sink + t.data[off];
    done += t.n_bytes;
    if (progress && total) progress(static_cast<double>(done) / static_cast<double>(total));
  }
  (void)sink;
}

}  // namespace ferry::model
