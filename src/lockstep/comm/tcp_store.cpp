#include "lockstep/comm/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "lockstep/comm/communicator.h"
#include "lockstep/comm/job_secret.h"
#include "lockstep/comm/tcp_protocol.h"
#include "lockstep/comm/tcp_store_server.h"

namespace lockstep::comm {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long a request may go unanswered by a server that neither replies nor closes the
// connection (stopped, or its host vanished): generous, since a healthy server answers in
// microseconds.
constexpr milliseconds kReplySlack = std::chrono::seconds(30);
constexpr milliseconds kRetryEvery = milliseconds(75);

int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1'000'000'000));
}

// One attempt to connect to one address, bounded by deadline; -1 with last_error on failure.
int try_connect(const addrinfo& target, Clock::time_point deadline, std::string& last_error) {
  const int fd = ::socket(target.ai_family, target.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, target.ai_protocol);
  if (fd < 0) {
    last_error = strerror(errno);
    return -1;
  }
  int error = 0;
  if (::connect(fd, target.ai_addr, target.ai_addrlen) != 0) {
    error = errno;
    if (error == EINPROGRESS) {
      pollfd waiting{fd, POLLOUT, 0};
      int ready = 0;
      while ((ready = ::poll(&waiting, 1, ms_until(deadline))) < 0 && errno == EINTR) {
      }
      socklen_t length = sizeof error;
      if (ready == 0) {
        error = ETIMEDOUT;
      } else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) {
        error = errno;
      }
    }
  }
  if (error == 0) {
    // Retrying a local port nobody listens on can, rarely, connect the socket to itself
    // (TCP simultaneous open when the ephemeral port equals the target).
    sockaddr_storage self{}, peer{};
    socklen_t self_length = sizeof self, peer_length = sizeof peer;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_length);
    ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length);
    if (self_length == peer_length && std::memcmp(&self, &peer, self_length) == 0) error = ECONNREFUSED;
  }
  if (error != 0) {
    last_error = strerror(error);
    ::close(fd);
    return -1;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// Connects to host:port, retrying while the server is not up yet; shown is the address the
// messages name.
int connect_with_retries(const std::string& host, int port, milliseconds timeout, const std::string& shown) {
  const Clock::time_point deadline = Clock::now() + detail::clamp_timeout(timeout);
  const std::string service = std::to_string(port);
  std::string last_error = "no attempt was made";
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* targets = nullptr;
    const int resolved = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &targets);
    if (resolved == 0) {
      for (const addrinfo* target = targets; target; target = target->ai_next) {
        if (const int fd = try_connect(*target, deadline, last_error); fd >= 0) {
          ::freeaddrinfo(targets);
          return fd;
        }
      }
      ::freeaddrinfo(targets);
    } else if (resolved == EAI_AGAIN) {
      last_error = gai_strerror(resolved);  // the resolver may come up; keep trying
    } else {
      throw CommError("cannot resolve '" + host + "', the rendezvous store's host: " + gai_strerror(resolved) +
                      "; set MASTER_ADDR to rank 0's host name or IPv4 address");
    }
    const int left = ms_until(deadline);
    if (left <= 0) {
      throw CommError("cannot reach the rendezvous store at " + shown + " within " + detail::seconds_text(timeout) +
                      " s (last error: " + last_error +
                      "); check that rank 0 was started, that every rank uses the same MASTER_ADDR/MASTER_PORT, "
                      "and that this host can reach it");
    }
    std::this_thread::sleep_for(std::min(kRetryEvery, milliseconds(left)));
  }
}

bool is_loopback_host(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0; }

}  // namespace

std::shared_ptr<TcpStore> TcpStore::create(const std::string& host, int port, bool is_server,
                                           std::chrono::milliseconds timeout, const std::string& secret) {
  LOCKSTEP_CHECK(port >= (is_server ? 0 : 1) && port <= 65535)
      << "rendezvous store port must be " << (is_server ? 0 : 1) << "..65535, got " << port
      << "; set MASTER_PORT to a free TCP port";
  LOCKSTEP_CHECK(!host.empty()) << "the rendezvous store needs a host: set MASTER_ADDR to rank 0's host";
  std::unique_ptr<tcp::StoreServer> server;
  if (is_server) {
    server = std::make_unique<tcp::StoreServer>(port, secret, is_loopback_host(host));
    port = server->port();
  }
  std::shared_ptr<TcpStore> store(new TcpStore(host, port, timeout));
  store->server_ = std::move(server);
  // The server listens on every interface; its own process reaches it over loopback.
  store->fd_ = connect_with_retries(is_server ? "127.0.0.1" : host, port, timeout, store->address());
  store->prove(secret);
  return store;
}

void TcpStore::prove(const std::string& secret) {
  const std::string refused = "the rendezvous store at " + address() +
                              " refused this rank: the ranks do not share the job's secret; start them with one "
                              "`lockstep run`, or give every rank the same " +
                              kJobSecretVariable;
  std::string challenge;
  {
    std::lock_guard lock(mutex_);
    try {
      challenge = receive_frame(timeout_ + kReplySlack);
    } catch (const CommError&) {
      broken_.clear();
      fail(refused);
    }
  }
  tcp::FrameReader reader(challenge);
  const uint8_t version = reader.u8();
  const std::string server_nonce = reader.str();
  if (!reader.ok() || version != tcp::kHandshakeVersion || server_nonce.size() != tcp::kNonceBytes) {
    std::lock_guard lock(mutex_);
    fail("the server at " + address() +
         " does not speak the rendezvous store's protocol; is MASTER_PORT the port of another service?");
  }
  const std::string client_nonce = random_bytes(tcp::kNonceBytes);
  std::string answer;
  try {
    answer = round_trip(
        tcp::FrameWriter().str(client_nonce).str(hmac_sha256(secret, tcp::kClientProof + server_nonce)).finish(),
        timeout_ + kReplySlack);
  } catch (const CommError&) {
    std::lock_guard lock(mutex_);
    broken_.clear();
    fail(refused);
  }
  tcp::FrameReader proof(answer);
  const std::string theirs = proof.str();
  const std::string expected = hmac_sha256(secret, tcp::kServerProof + client_nonce);
  if (!proof.ok() || theirs.size() != expected.size() ||
      CRYPTO_memcmp(theirs.data(), expected.data(), expected.size()) != 0) {
    std::lock_guard lock(mutex_);
    fail("the server at " + address() +
         " did not prove it holds the job's secret: another program may be listening on MASTER_PORT; choose "
         "another port");
  }
}

TcpStore::TcpStore(const std::string& host, int port, std::chrono::milliseconds timeout)
    : host_(host), port_(port), timeout_(detail::clamp_timeout(timeout)) {}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  server_.reset();  // after our own connection is closed: the server stops last
}

void TcpStore::fail(const std::string& message) {
  broken_ = message;
  ::close(fd_);
  fd_ = -1;
  throw CommError(message);
}

std::string TcpStore::round_trip(const std::string& request, std::chrono::milliseconds reply_within) {
  std::lock_guard lock(mutex_);
  if (!broken_.empty()) throw CommError(broken_);
  const std::string gone = "lost the rendezvous store at " + address() +
                           ": its server (rank 0) has exited or failed; see rank 0's output for why";
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = ::send(fd_, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(gone + " (" + strerror(errno) + ")");
    sent += static_cast<size_t>(n);
  }
  return receive_frame(reply_within);
}

std::string TcpStore::receive_frame(std::chrono::milliseconds within) {
  const std::string gone = "lost the rendezvous store at " + address() +
                           ": its server (rank 0) has exited or failed; see rank 0's output for why";
  const Clock::time_point deadline = Clock::now() + within;
  auto receive = [&](std::string& into, size_t count) {
    into.resize(count);
    for (size_t got = 0; got < count;) {
      pollfd readable{fd_, POLLIN, 0};
      const int ready = ::poll(&readable, 1, ms_until(deadline));
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) {
        fail("the rendezvous store at " + address() + " did not answer within " +
             detail::seconds_text(std::chrono::duration_cast<milliseconds>(within)) +
             " s; is rank 0 stopped or its host unreachable?");
      }
      const ssize_t n = ::recv(fd_, into.data() + got, count - got, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) fail(gone);
      if (n < 0) fail(gone + " (" + strerror(errno) + ")");
      got += static_cast<size_t>(n);
    }
  };
  std::string header, body;
  receive(header, tcp::kLengthBytes);
  const uint32_t length = tcp::decode_u32(header.data());
  if (length == 0 || length > tcp::kMaxFrame) {
    fail("the server at " + address() +
         " does not speak the rendezvous store's protocol; is MASTER_PORT the port "
         "of another service?");
  }
  receive(body, length);
  return body;
}

namespace {

// Reads a reply's status; a server-side error (add on a non-integer) is the caller's Error.
tcp::Status read_status(tcp::FrameReader& reply) {
  const auto status = static_cast<tcp::Status>(reply.u8());
  if (status == tcp::Status::error) throw Error(reply.str());
  return status;
}

}  // namespace

void TcpStore::set(const std::string& key, const std::string& value) {
  const std::string reply =
      round_trip(tcp::FrameWriter().u8(uint8_t(tcp::Op::set)).str(key).str(value).finish(), timeout_ + kReplySlack);
  tcp::FrameReader reader(reply);
  if (read_status(reader) != tcp::Status::ok || !reader.ok()) {
    std::lock_guard lock(mutex_);
    fail("malformed reply from the rendezvous store at " + address());
  }
}

std::string TcpStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  const milliseconds wait = detail::clamp_timeout(timeout);
  const std::string reply =
      round_trip(tcp::FrameWriter().u8(uint8_t(tcp::Op::get)).str(key).i64(wait.count()).finish(), wait + kReplySlack);
  tcp::FrameReader reader(reply);
  const tcp::Status status = read_status(reader);
  if (status == tcp::Status::timeout && reader.ok()) {
    throw CommError(detail::key_timeout_message(key, timeout, " at " + address()));
  }
  std::string value = reader.str();
  if (status != tcp::Status::ok || !reader.ok()) {
    std::lock_guard lock(mutex_);
    fail("malformed reply from the rendezvous store at " + address());
  }
  return value;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  const std::string reply =
      round_trip(tcp::FrameWriter().u8(uint8_t(tcp::Op::add)).str(key).i64(delta).finish(), timeout_ + kReplySlack);
  tcp::FrameReader reader(reply);
  const tcp::Status status = read_status(reader);
  const int64_t total = reader.i64();
  if (status != tcp::Status::ok || !reader.ok()) {
    std::lock_guard lock(mutex_);
    fail("malformed reply from the rendezvous store at " + address());
  }
  return total;
}

bool TcpStore::check(const std::string& key) {
  const std::string reply =
      round_trip(tcp::FrameWriter().u8(uint8_t(tcp::Op::check)).str(key).finish(), timeout_ + kReplySlack);
  tcp::FrameReader reader(reply);
  const tcp::Status status = read_status(reader);
  const uint8_t present = reader.u8();
  if (status != tcp::Status::ok || !reader.ok()) {
    std::lock_guard lock(mutex_);
    fail("malformed reply from the rendezvous store at " + address());
  }
  return present != 0;
}

}  // namespace lockstep::comm
