// The FERRY_CUDA_* knob readers (cuda/knobs.h); no GPU needed.
#include <gtest/gtest.h>

#include <cstdlib>

#include "cuda/knobs.h"

namespace ferry::test {
namespace {

constexpr const char* kName = "FERRY_CUDA_TEST_KNOB";

TEST(CudaKnobs, SizeReadsWholeDecimalNumbersOnly) {
  unsetenv(kName);
  EXPECT_EQ(cuda::knob_size(kName, 7), 7u);
  for (const auto& [text, want] :
       {std::pair{"0", size_t{0}}, std::pair{"3", size_t{3}}, std::pair{"0042", size_t{42}},
        std::pair{"", size_t{7}}, std::pair{"x", size_t{7}}, std::pair{"4x", size_t{7}},
        std::pair{"-1", size_t{7}}, std::pair{" 5", size_t{7}},
        std::pair{"99999999999999999999999", size_t{7}}}) {
    setenv(kName, text, 1);
    EXPECT_EQ(cuda::knob_size(kName, 7), want) << "'" << text << "'";
  }
  unsetenv(kName);
}

TEST(CudaKnobs, OffOnlyForZero) {
  unsetenv(kName);
  EXPECT_FALSE(cuda::knob_off(kName));
  for (const auto& [text, off] : {std::pair{"0", true}, std::pair{"1", false}, std::pair{"", false},
                                  std::pair{"00", false}}) {
    setenv(kName, text, 1);
    EXPECT_EQ(cuda::knob_off(kName), off) << "'" << text << "'";
  }
  unsetenv(kName);
}

}  // namespace
}  // namespace ferry::test
