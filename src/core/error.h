// Errors in ferry: validation at API boundaries throws ferry::Error whose
// message starts with the operation in brackets, e.g.
//   "[gguf] model.gguf: tensor 'blk.0.attn_q.weight': data extends past end of file"
// Capacity failures on hot paths are typed results (std::optional / status
// enums), never exceptions or -1 sentinels.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace ferry {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// Throws ferry::Error("[op] " + args...).
template <typename... Args>
[[noreturn]] void fail(const char* op, Args&&... args) {
  throw Error(detail::concat("[", op, "] ", std::forward<Args>(args)...));
}

// Always-on cheap invariant check.
#define FERRY_CHECK(cond, op, ...)                                             \
  do {                                                                         \
    if (!(cond)) ::ferry::fail(op, "check failed: " #cond " ", ##__VA_ARGS__); \
  } while (0)

}  // namespace ferry
