// StepTimeBudget: how many prompt tokens a scheduler step may take beside its
// decode rows, so that running streams are not stalled behind prefill.
//
// A step forwards d decode rows (one token each) and p prompt tokens. Its
// time is modelled as
//
//     t(d, p) ≈ c_d·d + c_p·p
//
// with c_d (seconds per decode row) and c_p (seconds per prompt token)
// re-fitted after every step from its measured time:
//   - a step with no prompt tokens:  c_d ← EWMA of t / d
//   - a step with prompt tokens:     c_p ← EWMA of max(0, t − ĉ_d·d) / p
// where ĉ_d is c_d or, before any decode-only step was seen, c_p's current
// value (a decode row costs at least what a prompt token does), else 0. EWMA weight
// of a new sample: kAlpha. On a CPU c_d is larger than c_p (a decode row
// pays for reading the weights with few others to share it); the model is
// a straight line through steps of the sizes the scheduler actually runs,
// which is all it needs to be.
//
// When decode rows are running, the prompt tokens of a step are capped at
//
//     floor((target − ĉ_d·d) / c_p), clamped to [min_prefill, budget]
//
// so the projected step stays within the target while prompts always make
// at least min_prefill tokens of progress (a step may then run over the
// target: decode rows are never dropped to make room). With no decode rows,
// or no target (target_seconds = 0), the whole budget is allowed; with
// decode rows but no estimate of c_p yet, min_prefill (that step measures
// it); with c_p = 0 (prompt tokens measured as free), the budget.
//
// Token outputs never depend on this: it only changes which step a prompt
// chunk is forwarded in (ferry's batch invariance, docs/KERNELS.md).
#pragma once

#include <cstddef>
#include <optional>

namespace ferry::engine {

class StepTimeBudget {
 public:
  static constexpr double kAlpha = 0.25;

  // target_seconds 0: off (prefill_allowance returns the budget).
  StepTimeBudget(double target_seconds, size_t min_prefill)
      : target_(target_seconds), min_prefill_(min_prefill) {}

  // Prompt tokens the next step may forward beside `decode_rows` decode rows,
  // out of `budget` tokens left after them.
  size_t prefill_allowance(size_t decode_rows, size_t budget) const;
  // The measured time of a step that forwarded `decode_rows` decode rows
  // and `prefill_tokens` prompt tokens. Steps of neither are ignored.
  void observe(size_t decode_rows, size_t prefill_tokens, double seconds);

  std::optional<double> seconds_per_decode_row() const { return c_d_; }
  std::optional<double> seconds_per_prompt_token() const { return c_p_; }
  bool enabled() const { return target_ > 0; }

 private:
  double target_;
  size_t min_prefill_;
  std::optional<double> c_d_, c_p_;
};

}  // namespace ferry::engine
