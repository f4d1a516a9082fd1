#include "engine/generate.h"

#include "engine/batch_engine.h"

namespace ferry::engine {

const char* finish_reason_name(FinishReason r) {
  return r == FinishReason::Stop ? "stop" : "length";
}

GenerationResult generate(const model::Model& model, const text::Tokenizer& tok,
                          const kernels::Context& ctx, const GenerationRequest& req,
                          const std::function<void(std::string_view)>& on_text) {
  // The solo path is the batched engine with one row.
  BatchEngine engine(model, tok, ctx, 1, req.kv_k, req.kv_v);
  engine.submit(req, on_text);
  GenerationResult out;
  engine.run([&](size_t, GenerationResult&& r) { out = std::move(r); });
  return out;
}

}  // namespace ferry::engine
