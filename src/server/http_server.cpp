#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "server/chat_page.h"
#include "server/connection_probe.h"
#include "server/generation.h"
#include "server/openai_response.h"
#include "server/prometheus.h"
#include "text/tokenizer.h"

namespace ferry::server {

namespace {

using Clock = std::chrono::steady_clock;
using httplib::Request;
using httplib::Response;
using Handled = httplib::Server::HandlerResponse;

// How often a request waiting on the engine checks its client and the
// shutdown grace. Events themselves wake it at once.
constexpr std::chrono::milliseconds kPoll{100};
// cpp-httplib listens with a backlog of 5, too short for hundreds of
// clients connecting at once; listen() again on the bound socket deepens it.
constexpr int kBacklog = 1024;

class Listener : public httplib::Server {
 public:
  void deepen_backlog(int n) { ::listen(svr_sock_, n); }
};

void send_json(Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_content(body, "application/json");
}

void send_error(Response& res, const ApiError& e) {
  send_json(res, e.status, error_body(e));
}

ApiError shutting_down() {
  return ApiError(503, "server_error", "the server is shutting down", {}, "server_shutting_down");
}

bool is_get_route(const std::string& path) {
  return path == "/" || path == "/health" || path == "/metrics" || path == "/v1/models" ||
         path.starts_with("/v1/models/");
}

bool is_post_route(const std::string& path) {
  return path == "/v1/chat/completions" || path == "/v1/completions";
}

// Compares in time independent of where the keys differ.
bool same_key(const std::string& given, const std::string& key) {
  unsigned diff = given.size() != key.size();
  for (size_t i = 0; i < given.size() && i < key.size(); ++i)
    diff |= static_cast<unsigned char>(given[i] ^ key[i]);
  return diff == 0;
}

struct ActiveCount {
  explicit ActiveCount(std::atomic<size_t>& n) : n_(n) { ++n_; }
  ~ActiveCount() { --n_; }
  std::atomic<size_t>& n_;
};

}  // namespace

class HttpServer::Impl {
 public:
  Impl(engine::Scheduler& scheduler, ServedModel model, ServerOptions options)
      : sched_(scheduler), model_(std::move(model)), opts_(std::move(options)) {
    routes();
  }

  int bind();
  void serve();
  void shutdown(std::chrono::milliseconds grace);

 private:
  void routes();
  Handled authorize(const Request& req, Response& res) const;
  Handled on_error(const Request& req, Response& res) const;
  void generate(Endpoint endpoint, const Request& req, Response& res);
  bool stream(Generation& gen, StreamRenderer& out, ConnectionProbe& probe,
              httplib::DataSink& sink) const;
  void answer_whole(Generation& gen, CompletionCollector& out, ConnectionProbe& probe,
                    Response& res) const;
  bool past_grace() const { return Clock::now().time_since_epoch().count() >= abort_at_.load(); }
  std::string models_json(const std::string* only) const;

  engine::Scheduler& sched_;
  ServedModel model_;
  ServerOptions opts_;
  Listener svr_;
  const int64_t created_ = std::time(nullptr);
  std::atomic<size_t> active_{0};
  std::atomic<bool> draining_{false};
  // Steady-clock tick after which requests still running are ended.
  std::atomic<Clock::rep> abort_at_{std::numeric_limits<Clock::rep>::max()};
  mutable std::mutex mu_;  // guards responses_, serve_done_, and draining_ transitions
  std::condition_variable stop_cv_;
  bool serve_done_ = false;
  std::map<int, uint64_t> responses_;
};

void HttpServer::Impl::routes() {
  const size_t threads = std::max<size_t>(1, opts_.max_connections);
  svr_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr_.set_tcp_nodelay(true);  // SSE chunks are small; Nagle would hold them back
  // SO_REUSEADDR only: cpp-httplib's default sets SO_REUSEPORT, which lets a
  // second server bind the same port and silently take part of its clients.
  svr_.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  svr_.set_payload_max_length(opts_.max_body_bytes);
  svr_.set_keep_alive_max_count(1000);
  svr_.set_read_timeout(30);
  // A client that reads nothing for this long while its socket buffer is
  // full is given up (and its generation cancelled).
  svr_.set_write_timeout(30);

  svr_.set_pre_routing_handler([this](const Request& q, Response& r) { return authorize(q, r); });
  svr_.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const Request& q, Response& r) { return on_error(q, r); }));
  svr_.set_exception_handler([](const Request&, Response& r, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(r, ApiError(500, "server_error", "internal error: " + what));
  });
  svr_.set_logger([this](const Request&, const Response& r) {
    std::lock_guard<std::mutex> lock(mu_);
    ++responses_[r.status];
  });

  svr_.Get("/", [](const Request&, Response& r) {
    r.set_content(std::string(chat_page_html()), "text/html; charset=utf-8");
  });
  svr_.Get("/health", [this](const Request&, Response& r) {
    if (draining_)
      send_json(r, 503, R"({"status":"shutting_down"})");
    else
      send_json(r, 200, R"({"status":"ok"})");
  });
  svr_.Get("/metrics", [this](const Request&, Response& r) {
    HttpStats http;
    http.active_requests = active_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      http.responses = responses_;
    }
    r.set_content(prometheus_text(sched_.metrics(), http),
                  "text/plain; version=0.0.4; charset=utf-8");
  });
  svr_.Get("/v1/models",
           [this](const Request&, Response& r) { send_json(r, 200, models_json(nullptr)); });
  svr_.Get("/v1/models/(.+)", [this](const Request& q, Response& r) {
    const std::string id = q.matches[1];
    if (id != model_.id)
      return send_error(
          r, ApiError(404, "invalid_request_error", "the model '" + id + "' does not exist",
                      "model", "model_not_found"));
    send_json(r, 200, models_json(&id));
  });
  auto guarded = [this](Endpoint ep) {
    return [this, ep](const Request& q, Response& r) {
      try {
        generate(ep, q, r);
      } catch (const ApiError& e) {
        send_error(r, e);
      } catch (const std::exception& e) {
        send_error(r, ApiError(500, "server_error", std::string("internal error: ") + e.what()));
      }
    };
  };
  svr_.Post("/v1/chat/completions", guarded(Endpoint::Chat));
  svr_.Post("/v1/completions", guarded(Endpoint::Completions));
}

std::string HttpServer::Impl::models_json(const std::string* only) const {
  ojson m = {{"id", model_.id},
             {"object", "model"},
             {"created", created_},
             {"owned_by", "ferry"},
             {"max_model_len", model_.context_length}};
  if (only) return dump_json(m);
  return dump_json({{"object", "list"}, {"data", ojson::array({m})}});
}

Handled HttpServer::Impl::authorize(const Request& req, Response& res) const {
  if (opts_.api_key.empty() || !req.path.starts_with("/v1/")) return Handled::Unhandled;
  const std::string auth = req.get_header_value("Authorization");
  const std::string prefix = "Bearer ";
  if (!auth.starts_with(prefix)) {
    send_error(res, ApiError(401, "invalid_request_error",
                             "missing API key: send the header 'Authorization: Bearer KEY'", {},
                             "invalid_api_key"));
  } else if (!same_key(auth.substr(prefix.size()), opts_.api_key)) {
    send_error(res, ApiError(401, "invalid_request_error", "incorrect API key provided", {},
                             "invalid_api_key"));
  } else {
    return Handled::Unhandled;
  }
  res.set_header("WWW-Authenticate", "Bearer");
  return Handled::Handled;
}

// Fills in OpenAI-shaped bodies for the errors cpp-httplib produces itself
// (no route, body too large, malformed request); our handlers' errors
// already have a body.
Handled HttpServer::Impl::on_error(const Request& req, Response& res) const {
  if (!res.body.empty()) return Handled::Unhandled;
  const bool get_route = is_get_route(req.path), post_route = is_post_route(req.path);
  const bool allowed = get_route ? (req.method == "GET" || req.method == "HEAD")
                                 : post_route && req.method == "POST";
  if ((get_route || post_route) && !allowed && (res.status == 404 || res.status == 400)) {
    res.set_header("Allow", get_route ? "GET, HEAD" : "POST");
    send_error(res, ApiError(405, "invalid_request_error",
                             "method " + req.method + " is not allowed on " + req.path, {},
                             "method_not_allowed"));
  } else if (res.status == 404) {
    send_error(res,
               ApiError(404, "invalid_request_error",
                        "invalid URL (" + req.method + " " + req.path + ")", {}, "unknown_url"));
  } else if (res.status == 413) {
    send_error(res, ApiError(413, "invalid_request_error",
                             "the request body is larger than the limit of " +
                                 std::to_string(opts_.max_body_bytes) + " bytes",
                             {}, "request_too_large"));
  } else {
    const bool client = res.status < 500;
    send_error(res, ApiError(res.status, client ? "invalid_request_error" : "server_error",
                             client ? "malformed HTTP request" : "internal server error"));
  }
  return Handled::Handled;
}

void HttpServer::Impl::generate(Endpoint endpoint, const Request& req, Response& res) {
  if (draining_) throw shutting_down();
  auto active = std::make_shared<ActiveCount>(active_);
  const ApiRequest api = parse_request(endpoint, req.body);
  const Plan plan = plan_request(api, model_);
  auto gen = std::make_shared<Generation>(sched_);
  gen->submit(plan, api.top_logprobs);
  ResponseInfo info{new_response_id(endpoint), std::time(nullptr), model_.id};
  auto probe = std::make_shared<ConnectionProbe>(req.local_addr, req.local_port, req.remote_addr,
                                                 req.remote_port);
  if (!api.stream) {
    CompletionCollector out(api, info, plan.choices.size(), plan.prompt_tokens, *model_.tokenizer);
    answer_whole(*gen, out, *probe, res);
    return;
  }
  auto out = std::make_shared<StreamRenderer>(api, info, plan.choices.size(), plan.prompt_tokens,
                                              *model_.tokenizer);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  // The whole stream is written inside one provider call: cpp-httplib stops
  // calling providers once the server stops listening, and a drained
  // stream must still reach its end.
  res.set_chunked_content_provider(
      "text/event-stream", [this, gen, out, probe, active](size_t, httplib::DataSink& sink) {
        return stream(*gen, *out, *probe, sink);
      });
}

bool HttpServer::Impl::stream(Generation& gen, StreamRenderer& out, ConnectionProbe& probe,
                              httplib::DataSink& sink) const {
  std::string buf = out.start();
  std::vector<Generation::Item> items;
  auto next_probe = Clock::now() + kPoll;
  while (!out.done()) {
    // Events that queued up while the last batch was written go out as
    // one write.
    gen.wait(items, kPoll);
    for (const Generation::Item& it : items) buf += out.add(it.choice, it.event);
    if (past_grace()) {
      gen.cancel();
      buf += out.abort(shutting_down());
    } else if (Clock::now() >= next_probe) {
      if (probe.peer_closed()) return false;  // the Generation's destructor cancels
      next_probe = Clock::now() + kPoll;
    }
    if (!buf.empty() && !sink.write(buf.data(), buf.size())) return false;
    buf.clear();
  }
  buf = out.finish();
  if (!sink.write(buf.data(), buf.size())) return false;
  sink.done();
  return true;
}

void HttpServer::Impl::answer_whole(Generation& gen, CompletionCollector& out,
                                    ConnectionProbe& probe, Response& res) const {
  std::vector<Generation::Item> items;
  auto next_probe = Clock::now() + kPoll;
  while (!out.done()) {
    gen.wait(items, kPoll);
    for (const Generation::Item& it : items) out.add(it.choice, it.event);
    if (out.done()) break;
    if (past_grace()) throw shutting_down();  // the Generation cancels
    if (Clock::now() >= next_probe) {
      if (probe.peer_closed()) {
        gen.cancel();
        // Nobody is left to read it; 499 is nginx's "client closed request".
        send_error(res, ApiError(499, "invalid_request_error", "the client closed the request"));
        return;
      }
      next_probe = Clock::now() + kPoll;
    }
  }
  if (out.error()) throw *out.error();
  send_json(res, 200, dump_json(out.body()));
}

int HttpServer::Impl::bind() {
  int port = opts_.port;
  errno = 0;
  if (port == 0) {
    port = svr_.bind_to_any_port(opts_.host);
  } else if (!svr_.bind_to_port(opts_.host, port)) {
    port = -1;
  }
  if (port < 0)
    fail("serve", "cannot listen on ", opts_.host, ":", opts_.port,
         errno ? std::string(": ") + std::strerror(errno) : std::string());
  svr_.deepen_backlog(kBacklog);
  return port;
}

void HttpServer::Impl::serve() {
  // stop() only works once the accept loop runs, and shutdown() may come
  // before it does: a helper thread waits for both.
  //
  // While draining, the listener stays open (new requests get 503) until no
  // request is in flight, or 2 s past the grace period at the latest:
  // cpp-httplib never calls the content provider of a response whose
  // headers go out after stop(), so stopping at once could end a stream
  // that had not written its first byte without its error event or [DONE].
  std::thread stopper([this] {
    const Clock::rep slack =
        std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(2)).count();
    std::unique_lock<std::mutex> lock(mu_);
    stop_cv_.wait(lock, [&] { return draining_ || serve_done_; });
    while (!serve_done_) {
      const Clock::rep now = Clock::now().time_since_epoch().count();
      const bool late = now >= abort_at_.load() && now - abort_at_.load() >= slack;
      if (svr_.is_running() && (active_.load() == 0 || late)) {
        lock.unlock();
        svr_.stop();
        return;
      }
      stop_cv_.wait_for(lock, std::chrono::milliseconds(10));
    }
  });
  svr_.listen_after_bind();
  {
    std::lock_guard<std::mutex> lock(mu_);
    serve_done_ = true;
  }
  stop_cv_.notify_all();
  stopper.join();
}

void HttpServer::Impl::shutdown(std::chrono::milliseconds grace) {
  const Clock::rep at = (Clock::now() + grace).time_since_epoch().count();
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
    if (at < abort_at_.load()) abort_at_ = at;
  }
  stop_cv_.notify_all();
}

HttpServer::HttpServer(engine::Scheduler& scheduler, ServedModel model, ServerOptions options)
    : impl_(std::make_unique<Impl>(scheduler, std::move(model), std::move(options))) {}
HttpServer::~HttpServer() = default;
int HttpServer::bind() {
  return impl_->bind();
}
void HttpServer::serve() {
  impl_->serve();
}
void HttpServer::shutdown(std::chrono::milliseconds grace) {
  impl_->shutdown(grace);
}

}  // namespace ferry::server
