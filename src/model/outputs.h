// What a forward step hands back per output (one output per token that
// produces logits). A caller says per output what it needs: the whole
// vocabulary row on the host, or only the row's largest logits and its
// log-sum-exp. On a GPU the latter is reduced on the device, so a greedy or
// top-k step copies a few bytes per row back instead of the vocabulary
// (128k floats per row for Llama 3).
//
// The contract: every output gets either its whole row or what it asked
// for; a backend may give the whole row instead (the CPU backend always
// does, its logits being in host memory already), and consumers then
// derive what they need from it (select_from_row).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "model/draw.h"

namespace ferry::model {

// The largest top_n a step may ask for per output.
inline constexpr uint32_t kMaxTopN = 1024;

struct OutputNeed {
  bool full = true;    // the whole row on the host
  uint32_t top_n = 0;  // the top_n largest logits (value desc, then id asc)
  bool lse = false;    // the row's max and sum of exp(l - max)
  // A token drawn on the device by draw_from_row's definition (model/draw.h)
  // with this spec, after `penalties` (a view into the caller's list, valid
  // until the step's outputs are read); the row is then not needed on the
  // host for sampling. The drawn token's value is its raw logit.
  std::optional<DrawSpec> draw;
  std::span<const DrawPenalty> penalties;
};

struct TopLogit {
  float value;
  int32_t id;
};

// log-sum-exp of a row as max + log(sum): sum of exp(l - max) in double.
struct LogSumExp {
  float max = NAN;
  double sum = 0.0;
  bool valid() const { return !std::isnan(max); }
  // log-softmax of a logit of the row.
  float logprob(float l) const {
    return static_cast<float>(static_cast<double>(l) - max - std::log(sum));
  }
};

// One output's logits as the step delivered them.
struct RowLogits {
  std::span<float> full;          // the whole row, or empty
  std::span<const TopLogit> top;  // largest first (may hold more than asked)
  LogSumExp lse;                  // invalid unless asked for (or full)
  TopLogit drawn{NAN, -1};        // the token drawn as asked, or id -1
};

// A step's outputs on the host; kept by the caller across steps so that
// steady-state steps allocate nothing.
struct StepOutputs {
  size_t vocab = 0;
  std::vector<float> logits;        // the whole rows delivered, packed
  std::vector<int64_t> full_row;    // per output: its row in `logits`, or -1
  size_t top_stride = 0;            // entries per output in `top`
  std::vector<TopLogit> top;        // per output: top_stride slots
  std::vector<uint32_t> top_count;  // per output: how many are filled
  std::vector<LogSumExp> lse;       // per output
  std::vector<TopLogit> drawn;      // per output when any was drawn (id -1: not)

  size_t size() const { return full_row.size(); }
  RowLogits row(size_t o);
  // Every output full ([n, vocab] packed in order); top/lse emptied.
  void reset_full(size_t n, size_t vocab);
};

// The reference reduction: the top_n largest of `row` (value desc, then id
// asc; -0 counts as +0; NaN never selected) and its log-sum-exp, on the host.
// Backends that reduce on the device must give the same ids and values.
void select_from_row(std::span<const float> row, uint32_t top_n, std::vector<TopLogit>& top,
                     LogSumExp* lse);

}  // namespace ferry::model
