#include "lockstep/comm/tcp_store_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/comm/job_secret.h"
#include "lockstep/comm/store.h"
#include "lockstep/comm/tcp_protocol.h"

namespace lockstep::comm::tcp {

namespace {

using Clock = std::chrono::steady_clock;

// The most connections served at once: the job's ranks, with room to spare; a flood of
// strangers beyond it is turned away at accept instead of exhausting rank 0's descriptors.
constexpr size_t kMaxConnections = 1024;
// Replies queued for one client that does not read them: past this, its requests wait.
constexpr size_t kMaxPendingReplies = 64u << 20;

struct Connection {
  int fd = -1;
  std::string in;
  std::string out;
  bool waiting = false;  // a get is parked: this client's later requests wait their turn
  bool closed = false;
  bool proved = false;  // it showed it holds the job's secret
  std::string nonce;    // the server's challenge to it
  Clock::time_point prove_by;
  // Whether to read more of its requests now: a stranger gets one handshake's worth, a
  // client with replies piling up gets none until it reads them.
  bool wants_input() const {
    if (!proved) return in.size() < kMaxHandshakeBytes;
    return out.size() < kMaxPendingReplies && in.size() < kLengthBytes + kMaxFrame;
  }
};

struct Waiter {
  uint64_t connection;
  std::string key;
  Clock::time_point deadline;
};

// All of the server's state; lives on the server thread only, so it needs no locks.
class ServerLoop {
 public:
  ServerLoop(int listen_fd, int wake_fd, std::string secret)
      : listen_fd_(listen_fd), wake_fd_(wake_fd), secret_(std::move(secret)) {}
  ~ServerLoop() {
    for (auto& [id, connection] : connections_) ::close(connection.fd);
  }
  void run();

 private:
  void accept_all();
  void read_from(Connection& connection);
  bool process(uint64_t id, Connection& connection);
  void prove(Connection& connection, std::string_view body);
  void handle(uint64_t id, Connection& connection, std::string_view body);
  void answer_waiters(const std::string& key);
  void expire_waiters();
  void flush(Connection& connection);
  int poll_timeout_ms() const;

  int listen_fd_;
  int wake_fd_;
  std::string secret_;
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
      const short events = (connection.wants_input() ? POLLIN : 0) | (connection.out.empty() ? 0 : POLLOUT);
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
    for (auto& [id, connection] : connections_) {
      if (!connection.proved && Clock::now() >= connection.prove_by) connection.closed = true;  // too slow to prove
    }
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
  std::optional<Clock::time_point> first;
  const auto earliest = [&](Clock::time_point t) { first = first ? std::min(*first, t) : t; };
  for (const Waiter& waiter : waiters_) earliest(waiter.deadline);
  for (const auto& [id, connection] : connections_) {
    if (!connection.proved) earliest(connection.prove_by);
  }
  if (!first) return -1;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(*first - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 60'000));
}

void ServerLoop::accept_all() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN: none left; anything else: the client went away already
    if (connections_.size() >= kMaxConnections) {
      ::close(fd);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Connection& connection = connections_[next_id_++];
    connection.fd = fd;
    connection.nonce = random_bytes(kNonceBytes);
    connection.prove_by = Clock::now() + std::chrono::seconds(kHandshakeSeconds);
    connection.out = FrameWriter().u8(kHandshakeVersion).str(connection.nonce).finish();
  }
}

void ServerLoop::read_from(Connection& connection) {
  char buffer[65536];
  while (connection.wants_input()) {
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
  while (!connection.closed && !connection.waiting && connection.out.size() < kMaxPendingReplies &&
         connection.in.size() >= kLengthBytes) {
    const uint32_t length = decode_u32(connection.in.data());
    if (length > (connection.proved ? kMaxFrame : kMaxHandshakeBytes)) {
      connection.closed = true;  // not one of our clients
      break;
    }
    if (connection.in.size() < kLengthBytes + length) break;
    const std::string body = connection.in.substr(kLengthBytes, length);
    connection.in.erase(0, kLengthBytes + length);
    if (connection.proved) {
      handle(id, connection, body);
    } else {
      prove(connection, body);
    }
    progress = true;
  }
  return progress;
}

// The client's answer to the challenge: right, and the server proves itself in turn;
// wrong, and the connection closes before any key is read or written.
void ServerLoop::prove(Connection& connection, std::string_view body) {
  FrameReader answer(body);
  const std::string client_nonce = answer.str();
  const std::string proof = answer.str();
  const std::string expected = hmac_sha256(secret_, kClientProof + connection.nonce);
  if (!answer.ok() || client_nonce.size() != kNonceBytes || proof.size() != expected.size() ||
      CRYPTO_memcmp(proof.data(), expected.data(), expected.size()) != 0) {
    connection.closed = true;
    return;
  }
  connection.proved = true;
  connection.out += FrameWriter().str(hmac_sha256(secret_, kServerProof + client_nonce)).finish();
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

StoreServer::StoreServer(int port, std::string secret, bool loopback_only) {
  LOCKSTEP_CHECK(port >= 0 && port <= 65535) << "rendezvous store port must be 0..65535, got " << port;
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw CommError(std::string("cannot create the rendezvous store's socket: ") + strerror(errno));
  // A server restarted right after an earlier job must not wait out TIME_WAIT.
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  // Loopback for a job of one host (MASTER_ADDR 127.0.0.1, as lockstep run sets); else every
  // interface, not the address MASTER_ADDR names: on Debian the host's own name resolves to
  // 127.0.1.1, which the other hosts cannot reach. The handshake keeps strangers out.
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(loopback_only ? INADDR_LOOPBACK : INADDR_ANY);
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
  thread_ = std::thread([listen_fd = listen_fd_, wake_fd = wake_fd_, secret = std::move(secret)] {
    ServerLoop(listen_fd, wake_fd, secret).run();
  });
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
