#include "lockstep/comm/tcp_store_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/comm/store.h"
#include "lockstep/comm/tcp_protocol.h"

namespace lockstep::comm::tcp {

namespace {

using Clock = std::chrono::steady_clock;

struct Connection {
  int fd = -1;
  std::string in;
  std::string out;
  bool waiting = false;  // a get is parked: this client's later requests wait their turn
  bool closed = false;
};

struct Waiter {
  uint64_t connection;
  std::string key;
  Clock::time_point deadline;
};

// All of the server's state; lives on the server thread only, so it needs no locks.
class ServerLoop {
 public:
  ServerLoop(int listen_fd, int wake_fd) : listen_fd_(listen_fd), wake_fd_(wake_fd) {}
  ~ServerLoop() {
    for (auto& [id, connection] : connections_) ::close(connection.fd);
  }
  void run();

 private:
  void accept_all();
  void read_from(Connection& connection);
  bool process(uint64_t id, Connection& connection);
  void handle(uint64_t id, Connection& connection, std::string_view body);
  void answer_waiters(const std::string& key);
  void expire_waiters();
  void flush(Connection& connection);
  int poll_timeout_ms() const;

  int listen_fd_;
  int wake_fd_;
  uint64_t next_id_ = 0;
  std::map<uint64_t, Connection> connections_;
  std::unordered_map<std::string, std::string> values_;
  std::vector<Waiter> waiters_;
};

std::string ok_frame() { return FrameWriter().u8(uint8_t(Status::ok)).finish(); }

void ServerLoop::run() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  for (;;) {
    fds.assign({{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}});
    ids.clear();
    for (auto& [id, connection] : connections_) {
      const short events = POLLIN | (connection.out.empty() ? 0 : POLLOUT);
      fds.push_back({connection.fd, events, 0});
      ids.push_back(id);
    }
    if (::poll(fds.data(), fds.size(), poll_timeout_ms()) < 0) {
      if (errno == EINTR) continue;
      return;  // cannot happen with valid fds; clients then see the connection close
    }
    if (fds[0].revents != 0) return;  // the destructor asked us to stop
    if (fds[1].revents & POLLIN) accept_all();
    for (size_t i = 0; i < ids.size(); ++i) {
      Connection& connection = connections_.at(ids[i]);
      const short revents = fds[i + 2].revents;
      if (revents & (POLLIN | POLLHUP | POLLERR)) read_from(connection);
      if ((revents & POLLOUT) && !connection.closed) flush(connection);
    }
    expire_waiters();
    // A set can release a parked client whose next request is already buffered: keep going
    // until no client has a request it can be answered for.
    for (bool progress = true; progress;) {
      progress = false;
      for (auto& [id, connection] : connections_) progress |= process(id, connection);
    }
    for (auto it = connections_.begin(); it != connections_.end();) {
      Connection& connection = it->second;
      if (!connection.closed && !connection.out.empty()) flush(connection);
      if (connection.closed) {
        const uint64_t id = it->first;
        std::erase_if(waiters_, [id](const Waiter& waiter) { return waiter.connection == id; });
        ::close(connection.fd);
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

int ServerLoop::poll_timeout_ms() const {
  if (waiters_.empty()) return -1;
  Clock::time_point first = waiters_.front().deadline;
  for (const Waiter& waiter : waiters_) first = std::min(first, waiter.deadline);
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(first - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 60'000));
}

void ServerLoop::accept_all() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN: none left; anything else: the client went away already
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    connections_[next_id_++].fd = fd;
  }
}

void ServerLoop::read_from(Connection& connection) {
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::recv(connection.fd, buffer, sizeof buffer, 0);
    if (n > 0) {
      connection.in.append(buffer, static_cast<size_t>(n));
      if (static_cast<size_t>(n) < sizeof buffer) return;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else {
      connection.closed = true;  // end of stream or a reset: the client is gone
      return;
    }
  }
}

// Answers the complete requests at the head of the buffer; true if it answered any.
bool ServerLoop::process(uint64_t id, Connection& connection) {
  bool progress = false;
  while (!connection.closed && !connection.waiting && connection.in.size() >= kLengthBytes) {
    const uint32_t length = decode_u32(connection.in.data());
    if (length > kMaxFrame) {
      connection.closed = true;  // not one of our clients
      break;
    }
    if (connection.in.size() < kLengthBytes + length) break;
    const std::string body = connection.in.substr(kLengthBytes, length);
    connection.in.erase(0, kLengthBytes + length);
    handle(id, connection, body);
    progress = true;
  }
  return progress;
}

void ServerLoop::handle(uint64_t id, Connection& connection, std::string_view body) {
  FrameReader request(body);
  const auto op = static_cast<Op>(request.u8());
  const std::string key = request.str();
  switch (op) {
    case Op::set: {
      std::string value = request.str();
      if (!request.ok()) break;
      values_[key] = std::move(value);
      connection.out += ok_frame();
      answer_waiters(key);
      return;
    }
    case Op::get: {
      const int64_t timeout_ms = request.i64();
      if (!request.ok()) break;
      if (auto it = values_.find(key); it != values_.end()) {
        connection.out += FrameWriter().u8(uint8_t(Status::ok)).str(it->second).finish();
      } else if (timeout_ms <= 0) {
        connection.out += FrameWriter().u8(uint8_t(Status::timeout)).finish();
      } else {
        const auto wait = comm::detail::clamp_timeout(std::chrono::milliseconds(timeout_ms));
        waiters_.push_back({id, key, Clock::now() + wait});
        connection.waiting = true;
      }
      return;
    }
    case Op::add: {
      const int64_t delta = request.i64();
      if (!request.ok()) break;
      int64_t total = delta;
      try {
        if (auto it = values_.find(key); it != values_.end()) total += comm::detail::parse_counter(key, it->second);
      } catch (const Error& error) {
        connection.out += FrameWriter().u8(uint8_t(Status::error)).str(error.what()).finish();
        return;
      }
      values_[key] = std::to_string(total);
      connection.out += FrameWriter().u8(uint8_t(Status::ok)).i64(total).finish();
      answer_waiters(key);
      return;
    }
    case Op::check: {
      if (!request.ok()) break;
      connection.out += FrameWriter().u8(uint8_t(Status::ok)).u8(values_.count(key) ? 1 : 0).finish();
      return;
    }
  }
  connection.closed = true;  // a malformed request: not one of our clients
}

void ServerLoop::answer_waiters(const std::string& key) {
  const std::string& value = values_.at(key);
  std::erase_if(waiters_, [&](const Waiter& waiter) {
    if (waiter.key != key) return false;
    Connection& connection = connections_.at(waiter.connection);
    connection.out += FrameWriter().u8(uint8_t(Status::ok)).str(value).finish();
    connection.waiting = false;
    return true;
  });
}

void ServerLoop::expire_waiters() {
  const Clock::time_point now = Clock::now();
  std::erase_if(waiters_, [&](const Waiter& waiter) {
    if (waiter.deadline > now) return false;
    Connection& connection = connections_.at(waiter.connection);
    connection.out += FrameWriter().u8(uint8_t(Status::timeout)).finish();
    connection.waiting = false;
    return true;
  });
}

void ServerLoop::flush(Connection& connection) {
  while (!connection.out.empty()) {
    const ssize_t n = ::send(connection.fd, connection.out.data(), connection.out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      connection.out.erase(0, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;  // the rest goes when poll says the socket is writable
    } else {
      connection.closed = true;
      return;
    }
  }
}

}  // namespace

StoreServer::StoreServer(int port) {
  LOCKSTEP_CHECK(port >= 0 && port <= 65535) << "rendezvous store port must be 0..65535, got " << port;
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw CommError(std::string("cannot create the rendezvous store's socket: ") + strerror(errno));
  // A server restarted right after an earlier job must not wait out TIME_WAIT.
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  // Every interface, not the address MASTER_ADDR names: on Debian the host's own name
  // resolves to 127.0.1.1, which the other hosts cannot reach.
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(listen_fd_, SOMAXCONN) != 0) {
    const int error = errno;
    ::close(listen_fd_);
    if (error == EADDRINUSE) {
      throw CommError("cannot serve the rendezvous store on port " + std::to_string(port) +
                      ": the port is already in use (by another job, or an earlier run still exiting); set "
                      "MASTER_PORT to another port, e.g. " +
                      std::to_string(port < 65535 ? port + 1 : 29500));
    }
    throw CommError("cannot serve the rendezvous store on port " + std::to_string(port) + ": " + strerror(error) +
                    "; set MASTER_PORT to another port");
  }
  socklen_t length = sizeof address;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length);
  port_ = ntohs(address.sin_port);

  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    const int error = errno;
    ::close(listen_fd_);
    throw CommError(std::string("cannot create the rendezvous store's eventfd: ") + strerror(error));
  }
  thread_ = std::thread([listen_fd = listen_fd_, wake_fd = wake_fd_] { ServerLoop(listen_fd, wake_fd).run(); });
}

StoreServer::~StoreServer() {
  const uint64_t one = 1;
  while (::write(wake_fd_, &one, sizeof one) < 0 && errno == EINTR) {
  }
  thread_.join();
  ::close(wake_fd_);
  ::close(listen_fd_);
}

}  // namespace lockstep::comm::tcp
