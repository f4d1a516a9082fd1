// Single-request generation: chunked prefill, then decode until a stop
// condition, streaming text as it becomes final. The continuous-batching
// scheduler (engine/scheduler) drives many requests; this is the solo path
// the CLI uses and the reference the batched path is compared with.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampler.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace ferry::engine {

struct GenerationRequest {
  std::vector<int32_t> prompt;
  size_t max_tokens = 256;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  // Whether results carry each token's logprob. Costs a pass of exp() over
  // the vocabulary per token (for 128k-token vocabularies and hundreds of
  // rows, a real share of a GPU step); NaN when off.
  bool logprobs = true;
  size_t prefill_chunk = 256;                         // prompt tokens per forward step
  kernels::KvFormat kv_k = kernels::KvFormat::f32();  // KV storage
  kernels::KvFormat kv_v = kernels::KvFormat::f32();
};

enum class FinishReason { Stop, Length };
const char* finish_reason_name(FinishReason r);  // "stop" | "length"

struct GenerationResult {
  std::vector<int32_t> tokens;  // every sampled token (incl. a final EOS)
  std::vector<float> logprobs;  // raw-distribution logprob of each token
  std::string text;             // decoded text, stop strings removed
  FinishReason finish = FinishReason::Length;
  double prefill_seconds = 0, decode_seconds = 0;
};

// on_text receives final text pieces in order (may be null).
GenerationResult generate(const model::Model& model, const text::Tokenizer& tok,
                          const kernels::Context& ctx, const GenerationRequest& req,
                          const std::function<void(std::string_view)>& on_text);

}  // namespace ferry::engine
