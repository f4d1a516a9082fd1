#include "server/prometheus.h"

#include <cstdio>
#include <cstdlib>

namespace ferry::server {

namespace {

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

// The shortest %g that reads back as the same double (0.005, not
// 0.0050000000000000001).
std::string num(double v) {
  char buf[32];
  for (int precision = 6; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

void metric(std::string& out, const char* name, const char* type, const char* help, double v) {
  header(out, name, type, help);
  out += name;
  out += ' ';
  out += num(v);
  out += '\n';
}

void histogram(std::string& out, const char* name, const char* help, const engine::Histogram& h) {
  header(out, name, "histogram", help);
  // counts[i] is already cumulative (observations <= bounds[i]); the last
  // entry is +Inf.
  for (size_t i = 0; i < h.counts.size(); ++i) {
    out += name;
    out += "_bucket{le=\"";
    out += i < h.bounds.size() ? num(h.bounds[i]) : std::string("+Inf");
    out += "\"} ";
    out += std::to_string(h.counts[i]);
    out += '\n';
  }
  out += std::string(name) + "_sum " + num(h.sum) + "\n";
  out += std::string(name) + "_count " + std::to_string(h.count) + "\n";
}

}  // namespace

std::string prometheus_text(const engine::SchedulerMetrics& m, const HttpStats& http) {
  std::string out;
  auto d = [](auto v) { return static_cast<double>(v); };
  metric(out, "ferry_requests_running", "gauge", "Requests in the running batch.", d(m.running));
  metric(out, "ferry_requests_waiting", "gauge", "Requests queued for admission.", d(m.waiting));
  metric(out, "ferry_kv_bytes_in_use", "gauge",
         "KV cache bytes reserved by admitted requests (prompt + max_tokens).",
         d(m.kv_bytes_in_use));
  metric(out, "ferry_kv_bytes_allocated", "gauge", "KV cache bytes allocated by the batch.",
         d(m.kv_bytes_allocated));
  metric(out, "ferry_kv_budget_bytes", "gauge", "KV cache budget for admission.",
         d(m.kv_budget_bytes));
  metric(out, "ferry_prompt_tokens_total", "counter", "Prompt tokens prefilled.",
         d(m.prompt_tokens_total));
  metric(out, "ferry_generation_tokens_total", "counter", "Tokens generated.",
         d(m.generation_tokens_total));
  metric(out, "ferry_requests_finished_total", "counter", "Requests that ran to their end.",
         d(m.requests_finished));
  metric(out, "ferry_requests_cancelled_total", "counter",
         "Requests cancelled (client gone or server stopping).", d(m.requests_cancelled));
  metric(out, "ferry_requests_rejected_total", "counter",
         "Requests refused because they could never fit the KV budget.", d(m.requests_rejected));
  histogram(out, "ferry_time_to_first_token_seconds",
            "Time from submission to the first generated token.", m.ttft);
  histogram(out, "ferry_inter_token_latency_seconds", "Time between a request's tokens.", m.itl);
  metric(out, "ferry_http_active_requests", "gauge", "Generation requests being answered.",
         d(http.active_requests));
  header(out, "ferry_http_responses_total", "counter", "HTTP responses by status.");
  for (const auto& [status, count] : http.responses)
    out += "ferry_http_responses_total{code=\"" + std::to_string(status) + "\"} " +
           std::to_string(count) + "\n";
  return out;
}

}  // namespace ferry::server
