// StepTimeBudget alone, with measured step times given by the test: the
// cost estimates and the prompt-token cap are exactly as documented in
// engine/step_policy.h. Times are powers of two so that every expected
// value is exact in binary floating point.
#include "engine/step_policy.h"

#include <gtest/gtest.h>

namespace ferry::engine {
namespace {

TEST(StepTimeBudget, OffOrNothingDecodingAllowsTheWholeBudget) {
  StepTimeBudget off(0, 32);
  off.observe(0, 64, 1.0);
  off.observe(16, 0, 1.0);
  EXPECT_FALSE(off.enabled());
  EXPECT_EQ(off.prefill_allowance(16, 496), 496u);

  StepTimeBudget on(0.25, 32);
  on.observe(0, 64, 1.0);  // prompt tokens measured as slow as can be
  EXPECT_EQ(on.prefill_allowance(0, 512), 512u);
}

TEST(StepTimeBudget, BeforeAnyPromptCostIsKnownDecodingStepsTakeTheMinimum) {
  StepTimeBudget p(0.25, 32);
  EXPECT_EQ(p.prefill_allowance(4, 508), 32u);
  p.observe(4, 0, 0.0625);  // a decode row cost alone does not size prompts
  EXPECT_EQ(p.prefill_allowance(4, 508), 32u);
  EXPECT_EQ(p.prefill_allowance(4, 20), 20u);  // never more than the budget
}

TEST(StepTimeBudget, CapIsTargetMinusDecodeCostOverPromptTokenCost) {
  StepTimeBudget p(0.25, 32);
  p.observe(0, 64, 0.125);  // c_p = 1/512 s
  EXPECT_DOUBLE_EQ(*p.seconds_per_prompt_token(), 0.001953125);
  // No decode-only step yet: a decode row is taken to cost a prompt token.
  // (0.25 - 16/512) * 512 = 112.
  EXPECT_EQ(p.prefill_allowance(16, 496), 112u);
  p.observe(16, 0, 0.0625);  // c_d = 1/256 s
  EXPECT_DOUBLE_EQ(*p.seconds_per_decode_row(), 0.00390625);
  // (0.25 - 16/256) * 512 = 96.
  EXPECT_EQ(p.prefill_allowance(16, 496), 96u);
  // Clamped: to the budget above, to the minimum below.
  EXPECT_EQ(p.prefill_allowance(16, 50), 50u);
  EXPECT_EQ(p.prefill_allowance(60, 452), 32u);   // 60 rows alone: 234 ms
  EXPECT_EQ(p.prefill_allowance(64, 448), 32u);   // rows alone reach the target
  EXPECT_EQ(p.prefill_allowance(100, 412), 32u);  // and overrun it
}

TEST(StepTimeBudget, EstimatesAreMovingAveragesAndMixedStepsSubtractDecodeCost) {
  StepTimeBudget p(0.25, 32);
  p.observe(0, 64, 0.125);  // c_p = 1/512
  p.observe(0, 64, 0.25);   // sample 1/256: 0.75/512 + 0.25/256
  EXPECT_DOUBLE_EQ(*p.seconds_per_prompt_token(), 0.00244140625);
  p.observe(8, 0, 0.03125);  // c_d = 1/256
  p.observe(8, 0, 0.0625);   // sample 1/128: 0.75/256 + 0.25/128
  EXPECT_DOUBLE_EQ(*p.seconds_per_decode_row(), 0.0048828125);
  // Mixed: 8 rows at c_d = 0.0390625 s, the rest over 32 prompt tokens:
  // (0.1015625 - 0.0390625) / 32 = 1/512; c_p = 0.75 * 0.00244140625 + 0.25/512.
  p.observe(8, 32, 0.1015625);
  EXPECT_DOUBLE_EQ(*p.seconds_per_prompt_token(), 0.75 * 0.00244140625 + 0.25 * 0.001953125);
  EXPECT_DOUBLE_EQ(*p.seconds_per_decode_row(), 0.0048828125);  // unchanged by mixed steps
  // A mixed step faster than its decode rows' estimate gives a sample of 0,
  // not a negative cost.
  StepTimeBudget q(0.25, 32);
  q.observe(8, 0, 0.0625);
  q.observe(0, 64, 0.125);
  q.observe(8, 64, 0.03125);
  EXPECT_DOUBLE_EQ(*q.seconds_per_prompt_token(), 0.75 * 0.001953125);
  // Steps with neither kind of token change nothing.
  q.observe(0, 0, 5.0);
  EXPECT_DOUBLE_EQ(*q.seconds_per_prompt_token(), 0.75 * 0.001953125);
}

}  // namespace
}  // namespace ferry::engine
