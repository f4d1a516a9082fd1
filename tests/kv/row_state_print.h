// Readable gtest output for RowState: {start, end, prefill_end, min_reusable}.
#pragma once

#include <ostream>

#include "kv/row_table.h"

namespace ferry::kv {

inline void PrintTo(const RowState& r, std::ostream* os) {
  *os << "{" << r.start << ", " << r.end << ", " << r.prefill_end << ", " << r.min_reusable << "}";
}

}  // namespace ferry::kv
