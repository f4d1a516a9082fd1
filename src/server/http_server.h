// `ferry serve`'s HTTP front: OpenAI-compatible routes over cpp-httplib.
//
//   GET  /                     the chat page (chat_page.h)
//   GET  /health               200 {"status":"ok"}; 503 while shutting down
//   GET  /metrics              Prometheus text (prometheus.h)
//   GET  /v1/models[/ID]       the served model
//   POST /v1/chat/completions  chat, streamed (SSE) or whole
//   POST /v1/completions       completions, streamed (SSE) or whole
//
// Threading: one thread per connection from a fixed pool of
// max_connections threads (more connections wait in the accept queue), one
// engine thread in the scheduler. A request's thread submits its choices
// and then drains their events (generation.h), writing each batch of
// chunks as it comes; it never holds a lock the engine needs. A client that
// disconnects is noticed by a failed write or, while waiting, by polling
// its socket; its choices are cancelled and their KV freed at the next
// step.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "engine/scheduler.h"
#include "server/openai_api.h"

namespace ferry::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                  // 0: any free port (bind() says which)
  std::string api_key;              // empty: no authentication
  size_t max_connections = 512;     // connection threads
  size_t max_body_bytes = 1 << 20;  // larger request bodies get 413
};

class HttpServer {
 public:
  HttpServer(engine::Scheduler& scheduler, ServedModel model, ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Listens on host:port and returns the port. Throws ferry::Error.
  int bind();
  // Serves on the calling thread until shutdown() and until every
  // connection's current request has ended.
  void serve();
  // Any thread, returns at once; later calls may shorten the grace.
  // New connections are refused at once; requests in flight run to their
  // end, or after `grace` are cancelled and ended cleanly (a stream gets an
  // error event and [DONE], a whole answer a 503).
  void shutdown(std::chrono::milliseconds grace);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::server
