// The server half of TcpStore: a thread, owned by rank 0's store, that holds the keys and
// answers every rank. One poll() loop serves the listening socket, all clients and an
// eventfd the destructor signals; a get() for a missing key parks as a waiter and is
// answered when the key is set or its deadline passes, so it never holds up other clients.
#pragma once

#include <string>
#include <thread>

namespace lockstep::comm::tcp {

class StoreServer {
 public:
  // Listens at port (0: the kernel picks a free one) — on loopback only, or on every IPv4
  // interface — and starts the thread; serves only clients that prove they hold `secret`
  // (tcp_protocol.h). Throws CommError when the port is taken, suggesting another MASTER_PORT.
  StoreServer(int port, std::string secret, bool loopback_only);
  // Stops the thread and closes every connection: clients still waiting get CommError.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }

 private:
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace lockstep::comm::tcp
