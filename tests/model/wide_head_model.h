// A synthetic llama for tests of head dimensions the committed tiny models
// lack: their tokenizer and vocabulary, bf16 weights drawn from a seed,
// `heads` query heads of head_dim `hd` (the tiny files have 16, or 64 with
// Q4_K weights), two layers, written to a temporary file. Its text means
// nothing; it exercises attention and KV paths (tensor-core attention and
// affine caches on the GPU, head_dim 128).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "model/test_models.h"

namespace ferry::test {

// The model's path (under the test temp dir; the caller removes it).
inline std::string wide_head_model(uint32_t heads, uint32_t kv_heads, uint32_t hd) {
  const auto src = gguf::File::open(data_path("models/tiny-llama-bf16.gguf"));
  const uint32_t H = heads * hd, F = 2 * H, layers = 2;
  const uint64_t V = static_cast<uint64_t>(src->get_string_array("tokenizer.ggml.tokens").size());
  const std::map<std::string, uint32_t, std::less<>> dims = {
      {"llama.embedding_length", H},         {"llama.feed_forward_length", F},
      {"llama.attention.head_count", heads}, {"llama.attention.head_count_kv", kv_heads},
      {"llama.attention.key_length", hd},    {"llama.attention.value_length", hd},
      {"llama.rope.dimension_count", hd},    {"llama.block_count", layers}};
  GgufWriter w;
  for (const auto& [key, value] : src->metadata()) {
    const auto d = dims.find(key);
    if (d != dims.end())
      w.add_u32(key, d->second);
    else
      w.add(key, value);
  }
  std::mt19937 rng(hd);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto matrix = [&](const std::string& name, uint64_t n_in, uint64_t n_out) {
    const float s = 1.0f / std::sqrt(static_cast<float>(n_in));
    std::vector<uint8_t> b(n_in * n_out * 2);
    for (size_t i = 0; i < n_in * n_out; ++i) {
      const uint16_t x = f32_to_bf16(u(rng) * s);
      b[2 * i] = static_cast<uint8_t>(x & 0xff);
      b[2 * i + 1] = static_cast<uint8_t>(x >> 8);
    }
    w.add_tensor(name, {n_in, n_out}, DType::BF16, std::move(b));
  };
  auto norm = [&](const std::string& name) {
    w.add_tensor_f32(name, {H}, std::vector<float>(H, 1.0f));
  };
  matrix("token_embd.weight", H, V);
  for (uint32_t l = 0; l < layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    norm(b + "attn_norm.weight");
    matrix(b + "attn_q.weight", H, H);
    matrix(b + "attn_k.weight", H, kv_heads * hd);
    matrix(b + "attn_v.weight", H, kv_heads * hd);
    matrix(b + "attn_output.weight", H, H);
    norm(b + "ffn_norm.weight");
    matrix(b + "ffn_gate.weight", H, F);
    matrix(b + "ffn_up.weight", H, F);
    matrix(b + "ffn_down.weight", F, H);
  }
  norm("output_norm.weight");
  // (Per process: ctest runs tests side by side.)
  const std::string path = ::testing::TempDir() + "ferry-head" + std::to_string(hd) + "-" +
                           std::to_string(getpid()) + ".gguf";
  w.write_file(path);
  return path;
}

}  // namespace ferry::test
