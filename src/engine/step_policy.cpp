#include "engine/step_policy.h"

#include <algorithm>
#include <cmath>

namespace ferry::engine {

static void ewma(std::optional<double>& est, double sample) {
  est = est ? (1 - StepTimeBudget::kAlpha) * *est + StepTimeBudget::kAlpha * sample : sample;
}

size_t StepTimeBudget::prefill_allowance(size_t decode_rows, size_t budget) const {
  if (!enabled() || decode_rows == 0) return budget;
  const size_t floor_tokens = std::min(min_prefill_, budget);
  if (!c_p_) return floor_tokens;
  if (*c_p_ <= 0) return budget;
  const double c_d = c_d_ ? *c_d_ : *c_p_;
  const double room = (target_ - c_d * static_cast<double>(decode_rows)) / *c_p_;
  if (room <= static_cast<double>(floor_tokens)) return floor_tokens;
  if (room >= static_cast<double>(budget)) return budget;
  return static_cast<size_t>(std::floor(room));
}

void StepTimeBudget::observe(size_t decode_rows, size_t prefill_tokens, double seconds) {
  if (prefill_tokens == 0) {
    if (decode_rows > 0) ewma(c_d_, seconds / static_cast<double>(decode_rows));
    return;
  }
  const double c_d = c_d_ ? *c_d_ : c_p_.value_or(0);
  const double rest = std::max(0.0, seconds - c_d * static_cast<double>(decode_rows));
  ewma(c_p_, rest / static_cast<double>(prefill_tokens));
}

}  // namespace ferry::engine
