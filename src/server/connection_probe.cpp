#include "server/connection_probe.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>

namespace ferry::server {

namespace {

// The numeric host and port of a socket address, as cpp-httplib prints
// them for Request::remote_addr / local_addr.
bool name_of(const sockaddr_storage& addr, socklen_t len, std::string& host, int& port) {
  char h[NI_MAXHOST], s[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, h, sizeof h, s, sizeof s,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  host = h;
  port = std::atoi(s);
  return true;
}

}  // namespace

ConnectionProbe::ConnectionProbe(std::string local_addr, int local_port, std::string remote_addr,
                                 int remote_port)
    : local_addr_(std::move(local_addr)),
      remote_addr_(std::move(remote_addr)),
      local_port_(local_port),
      remote_port_(remote_port) {}

bool ConnectionProbe::peer_closed() {
  if (fd_ == -2) {
    fd_ = -1;
    if (DIR* dir = opendir("/proc/self/fd")) {
      while (dirent* e = readdir(dir)) {
        char* end = nullptr;
        const long fd = std::strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0') continue;
        sockaddr_storage peer{}, local{};
        socklen_t pl = sizeof peer, ll = sizeof local;
        std::string host;
        int port = 0;
        if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0 ||
            !name_of(peer, pl, host, port) || port != remote_port_ || host != remote_addr_)
          continue;
        if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||
            !name_of(local, ll, host, port) || port != local_port_ || host != local_addr_)
          continue;
        fd_ = static_cast<int>(fd);
        break;
      }
      closedir(dir);
    }
  }
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLRDHUP, 0};
  // POLLRDHUP: the peer shut its side (closed the socket); POLLHUP/POLLERR:
  // reset. Plain POLLIN (a pipelined next request) is not a hang-up.
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace ferry::server
