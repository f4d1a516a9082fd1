// /metrics in Prometheus' text exposition format (version 0.0.4), from the
// scheduler's metrics and the HTTP layer's counters.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "engine/scheduler.h"

namespace ferry::server {

struct HttpStats {
  size_t active_requests = 0;         // generation requests being answered now
  std::map<int, uint64_t> responses;  // by HTTP status
};

std::string prometheus_text(const engine::SchedulerMetrics& m, const HttpStats& http);

}  // namespace ferry::server
