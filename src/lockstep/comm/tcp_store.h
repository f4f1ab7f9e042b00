// A Store that ranks on any hosts reach over TCP, as torch's TCPStore: rank 0 serves it at
// MASTER_ADDR:MASTER_PORT (tcp_store_server.h) and every rank, rank 0 included, is a client
// of that server. IPv4 only. Rank 0's store must outlive every other rank's use of it:
// destroying it stops the server, and clients still talking to it get CommError.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "lockstep/comm/store.h"

namespace lockstep::comm {

namespace tcp {
class StoreServer;
}

class TcpStore : public Store {
 public:
  // is_server: serve at port (0: any free port, see port()) and connect to it. Otherwise
  // connect to host:port, retrying until timeout while the server starts; then throw
  // CommError naming host:port. Server and client prove to each other that they hold the
  // job's `secret` (job_secret.h) before any key moves; a server for a host of loopback
  // addresses (127.0.0.1, localhost) listens on loopback only.
  static std::shared_ptr<TcpStore> create(const std::string& host, int port, bool is_server,
                                          std::chrono::milliseconds timeout, const std::string& secret);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  // Calls from several threads are served one at a time: a get() that waits for its key
  // holds up this store's other calls (not other ranks').
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::string& key) override;

  int port() const { return port_; }
  const std::string& host() const { return host_; }

 private:
  TcpStore(const std::string& host, int port, std::chrono::milliseconds timeout);
  std::string address() const { return host_ + ":" + std::to_string(port_); }
  // Sends one request frame and returns the reply's body. reply_within bounds the wait for
  // a server that stopped answering without closing the connection.
  std::string round_trip(const std::string& request, std::chrono::milliseconds reply_within);
  // Reads one frame's body (caller holds mutex_).
  std::string receive_frame(std::chrono::milliseconds within);
  // The handshake of tcp_protocol.h, client side.
  void prove(const std::string& secret);
  [[noreturn]] void fail(const std::string& message);

  std::unique_ptr<tcp::StoreServer> server_;
  std::string host_;
  int port_ = 0;
  std::chrono::milliseconds timeout_;

  std::mutex mutex_;  // one request at a time on the connection; guards fd_ and broken_
  int fd_ = -1;
  std::string broken_;  // set once the connection failed; later calls rethrow it
};

}  // namespace lockstep::comm
