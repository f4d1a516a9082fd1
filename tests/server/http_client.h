// A tiny blocking HTTP/1.1 client for the server's end-to-end tests: one
// connection per request, Content-Length and chunked bodies, SSE events
// read as they arrive, and raw bytes for malformed requests.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <map>
#include <string>

namespace ferry::test {

struct HttpResponse {
  int status = 0;                              // 0: no response (connection failed or closed early)
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

class HttpConnection {
 public:
  explicit HttpConnection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) close();
    timeval tv{60, 0};  // no test waits this long for a byte
    if (fd_ >= 0) setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~HttpConnection() { close(); }
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  bool ok() const { return fd_ >= 0; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  bool send_raw(const std::string& bytes) {
    size_t off = 0;
    while (fd_ >= 0 && off < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return fd_ >= 0;
  }

  bool send_request(const std::string& method, const std::string& path, const std::string& body,
                    const std::map<std::string, std::string>& headers = {}) {
    std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    for (const auto& [k, v] : headers) req += k + ": " + v + "\r\n";
    if (!body.empty() || method == "POST") {
      req += "Content-Type: application/json\r\n";
      req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    }
    req += "Connection: close\r\n\r\n" + body;
    return send_raw(req);
  }

  // Reads the status line and headers. False if the server sent none.
  bool read_head(HttpResponse& r) {
    std::string line;
    if (!read_line(line) || line.rfind("HTTP/1.1 ", 0) != 0) return false;
    r.status = std::atoi(line.c_str() + 9);
    while (read_line(line) && !line.empty()) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      size_t v = colon + 1;
      while (v < line.size() && line[v] == ' ') ++v;
      r.headers[name] = line.substr(v);
    }
    return true;
  }

  // Reads the body, passing each piece to on_data as it arrives (chunked
  // or Content-Length or until close). on_data returning false stops
  // reading. Returns false if the body ended early.
  bool read_body(const HttpResponse& r, const std::function<bool(const std::string&)>& on_data) {
    auto te = r.headers.find("transfer-encoding");
    if (te != r.headers.end() && te->second == "chunked") {
      for (;;) {
        std::string line;
        if (!read_line(line)) return false;
        const size_t n = std::strtoul(line.c_str(), nullptr, 16);
        if (n == 0) return read_line(line);
        std::string chunk;
        if (!read_exact(n, chunk) || !read_line(line)) return false;
        if (!on_data(chunk)) return true;
      }
    }
    auto cl = r.headers.find("content-length");
    if (cl != r.headers.end()) {
      std::string data;
      if (!read_exact(std::strtoul(cl->second.c_str(), nullptr, 10), data)) return false;
      on_data(data);
      return true;
    }
    std::string data;
    while (fill()) {
      data.swap(buf_);
      if (!on_data(data)) return true;
    }
    return true;
  }

 private:
  bool fill() {
    if (fd_ < 0) return false;
    char tmp[16384];
    const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }
  bool read_line(std::string& line) {
    size_t end;
    while ((end = buf_.find("\r\n")) == std::string::npos)
      if (!fill()) return false;
    line = buf_.substr(0, end);
    buf_.erase(0, end + 2);
    return true;
  }
  bool read_exact(size_t n, std::string& out) {
    while (buf_.size() < n)
      if (!fill()) return false;
    out = buf_.substr(0, n);
    buf_.erase(0, n);
    return true;
  }

  int fd_ = -1;
  std::string buf_;
};

// One whole request on a fresh connection.
inline HttpResponse http_request(int port, const std::string& method, const std::string& path,
                                 const std::string& body = "",
                                 const std::map<std::string, std::string>& headers = {}) {
  HttpResponse r;
  HttpConnection c(port);
  if (!c.send_request(method, path, body, headers) || !c.read_head(r)) return r;
  c.read_body(r, [&](const std::string& d) {
    r.body += d;
    return true;
  });
  return r;
}

// Splits an SSE byte stream into events' data lines as they complete.
class SseParser {
 public:
  // Feeds bytes; calls on_event(data) for each complete "data: ..." event.
  template <typename F>
  void feed(const std::string& bytes, F&& on_event) {
    buf_ += bytes;
    size_t end;
    while ((end = buf_.find("\n\n")) != std::string::npos) {
      const std::string ev = buf_.substr(0, end);
      buf_.erase(0, end + 2);
      if (ev.rfind("data: ", 0) == 0) on_event(ev.substr(6));
    }
  }
  bool empty() const { return buf_.empty(); }

 private:
  std::string buf_;
};

}  // namespace ferry::test
