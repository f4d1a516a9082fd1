// Tells whether the client of an accepted connection has hung up, so that a
// request waiting on the engine (queued, or between tokens) is cancelled
// without waiting for a write to fail.
//
// cpp-httplib 0.11 does not give handlers their socket, so the probe finds
// it once by its addresses among the process's descriptors (Linux:
// /proc/self/fd; a TCP connection's four addresses are unique). The socket
// stays open, and so keeps its descriptor, while its handler runs.
#pragma once

#include <string>

namespace ferry::server {

class ConnectionProbe {
 public:
  ConnectionProbe(std::string local_addr, int local_port, std::string remote_addr, int remote_port);
  // True once the peer has closed or reset the connection. The first call
  // looks the socket up (cost: two syscalls per open descriptor); later
  // calls are one poll(). False when the socket cannot be found.
  bool peer_closed();

 private:
  std::string local_addr_, remote_addr_;
  int local_port_, remote_port_;
  int fd_ = -2;  // -2: not looked up yet; -1: not found
};

}  // namespace ferry::server
