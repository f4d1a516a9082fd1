// Finds stop strings in streamed text across token boundaries. Text that
// could still be the start of a stop string is held back, so a stop string
// is never emitted, even in part.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ferry::engine {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  // Appends text; returns the text now safe to emit. After a stop string is
  // found, stopped() is true and the text before it has been returned.
  std::string push(std::string_view text);
  // At the end of generation: everything held back (no stop was found).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace ferry::engine
