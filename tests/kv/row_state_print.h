// Readable gtest output for RowState:
// {start, end, prefill_end, min_reusable, ring_lost, pending_prefill}.
#pragma once

#include <ostream>

#include "kv/row_table.h"

namespace ferry::kv {

inline void PrintTo(const RowState& r, std::ostream* os) {
  *os << "{" << r.start << ", " << r.end << ", " << r.prefill_end << ", " << r.min_reusable << ", "
      << r.ring_lost << ", " << r.pending_prefill << "}";
}

}  // namespace ferry::kv
