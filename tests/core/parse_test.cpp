// core/parse.h: whole unsigned decimal numbers, and everything else refused.
#include "core/parse.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>

namespace ferry {
namespace {

TEST(ParseDecimal, DigitsOnlyAndWithinSizeT) {
  EXPECT_EQ(parse_decimal("0"), size_t{0});
  EXPECT_EQ(parse_decimal("0042"), size_t{42});
  const size_t max = std::numeric_limits<size_t>::max();
  EXPECT_EQ(parse_decimal(std::to_string(max)), max);
  std::string over = std::to_string(max);
  ++over.back();  // max + 1 (max ends in 5 for a 64-bit size_t)
  for (const std::string& bad :
       {std::string(), std::string("-1"), std::string("+1"), std::string(" 5"), std::string("5 "),
        std::string("4k"), std::string("0x10"), over, std::to_string(max) + "0"})
    EXPECT_EQ(parse_decimal(bad), std::nullopt) << "'" << bad << "'";
}

}  // namespace
}  // namespace ferry
