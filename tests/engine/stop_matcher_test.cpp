#include "engine/stop_matcher.h"

#include <gtest/gtest.h>

namespace ferry::engine {
namespace {

TEST(StopMatcher, NoStopsPassesEverythingThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.push("hello"), "hello");
  EXPECT_EQ(m.push(" world"), " world");
  EXPECT_EQ(m.flush(), "");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, MatchAcrossPiecesIsNeverEmitted) {
  StopMatcher m({"</end>"});
  EXPECT_EQ(m.push("abc</"), "abc");  // "</" may start the stop string
  EXPECT_EQ(m.push("en"), "");
  EXPECT_EQ(m.push("d>tail"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more"), "");
}

TEST(StopMatcher, HeldBackTextIsReleasedWhenItStopsMatching) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("xST"), "x");
  EXPECT_EQ(m.push("Ay"), "STAy");
  EXPECT_EQ(m.push("S"), "");
  EXPECT_EQ(m.flush(), "S");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, EarliestOfSeveralStopsWins) {
  StopMatcher m({"cd", "b"});
  EXPECT_EQ(m.push("abcd"), "a");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, StopAtVeryStart) {
  StopMatcher m({"\n\n"});
  EXPECT_EQ(m.push("\n"), "");
  EXPECT_EQ(m.push("\n"), "");
  EXPECT_TRUE(m.stopped());
}

}  // namespace
}  // namespace ferry::engine
