// The rendezvous stores: the same semantics for MemoryStore, TcpStore and FileStore, the
// timeouts' messages, store_all_gather across threads and processes.
#include "lockstep/comm/store.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/comm/file_store.h"
#include "lockstep/comm/tcp_protocol.h"
#include "lockstep/comm/tcp_store.h"

namespace lockstep::comm {
namespace {

using namespace std::chrono_literals;

// The message of the E that f throws; a failure if it throws nothing.
template <typename E, typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const E& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// What every Store promises, checked against plain expectations.
void expect_store_semantics(Store& store) {
  EXPECT_FALSE(store.check("a/b"));
  store.set("a/b", "first");
  EXPECT_TRUE(store.check("a/b"));
  EXPECT_EQ(store.get("a/b", 1s), "first");
  store.set("a/b", "second");
  EXPECT_EQ(store.get("a/b", 1s), "second");
  // Keys that an encoding could confuse with "a/b" stay apart.
  store.set("a%2Fb", "percent");
  store.set("a_b", "underscore");
  EXPECT_EQ(store.get("a/b", 1s), "second");
  EXPECT_EQ(store.get("a%2Fb", 1s), "percent");
  EXPECT_EQ(store.get("a_b", 1s), "underscore");

  const std::string binary = std::string("\0\x01\xff\n", 4) + std::string(70000, 'x');
  store.set("binary", binary);
  EXPECT_EQ(store.get("binary", 1s), binary);
  store.set("empty", "");
  EXPECT_TRUE(store.check("empty"));
  EXPECT_EQ(store.get("empty", 1s), "");

  EXPECT_EQ(store.add("count", 5), 5);
  EXPECT_EQ(store.add("count", -7), -2);
  EXPECT_EQ(store.add("count", 0), -2);
  EXPECT_EQ(store.get("count", 1s), "-2");
  const std::string not_counter = error_message<Error>([&] { store.add("a/b", 1); });
  EXPECT_TRUE(contains(not_counter, "'a/b'")) << not_counter;
  EXPECT_EQ(store.get("a/b", 1s), "second");  // a failed add changes nothing
}

void expect_get_timeout_names_key(Store& store) {
  const std::string message = error_message<CommError>([&] { store.get("never/set", 150ms); });
  EXPECT_TRUE(contains(message, "timed out after 0.15 s waiting for key 'never/set'")) << message;
  EXPECT_FALSE(store.check("never/set"));
}

// size ranks, each on its own thread with the store make_store(rank) gives it, gather
// "value-r*r"; every rank must see all values in rank order.
void expect_all_gather_in_rank_order(const std::function<std::shared_ptr<Store>(int)>& make_store, int size) {
  std::vector<std::vector<std::string>> results(size);
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::shared_ptr<Store> store = make_store(r);
        results[r] = store_all_gather(*store, "gather", r, size, "value-" + std::to_string(r * r), 20s, "test");
      } catch (const std::exception& error) {
        errors[r] = error.what();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::vector<std::string> expected;
  for (int r = 0; r < size; ++r) expected.push_back("value-" + std::to_string(r * r));
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(results[r], expected) << "rank " << r;
  }
}

// Ranks 0 and 1 of 4 gather; 2 and 3 never come. Both must name exactly the missing ones.
void expect_all_gather_names_missing_ranks(Store& store) {
  std::string messages[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      messages[r] = error_message<CommError>(
          [&] { store_all_gather(store, "partial", r, 4, "v", 200ms, "rendezvous of the test backend"); });
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::string& message : messages) {
    EXPECT_TRUE(contains(message, "rendezvous of the test backend: ranks 2, 3 of 4 did not arrive within 0.2 s"))
        << message;
    EXPECT_TRUE(contains(message, "MASTER_ADDR/MASTER_PORT")) << message;
  }
}

// A directory under /tmp for one test, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/lockstep-store-test-XXXXXX";
    const char* made = ::mkdtemp(pattern);
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = made;
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

bool exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

// ---- MemoryStore ----

TEST(MemoryStore, SetGetAddCheck) {
  MemoryStore store;
  expect_store_semantics(store);
}

TEST(MemoryStore, GetTimeoutNamesKey) {
  MemoryStore store;
  expect_get_timeout_names_key(store);
}

TEST(MemoryStore, GetWaitsForAnotherThreadsSet) {
  MemoryStore store;
  std::thread setter([&] {
    std::this_thread::sleep_for(20ms);
    store.set("late", "here");
  });
  EXPECT_EQ(store.get("late", 10s), "here");
  setter.join();
}

TEST(MemoryStore, AllGatherReturnsRankOrder) {
  auto store = std::make_shared<MemoryStore>();
  expect_all_gather_in_rank_order([&](int) { return store; }, 4);
}

TEST(MemoryStore, AllGatherNamesMissingRanks) {
  MemoryStore store;
  expect_all_gather_names_missing_ranks(store);
}

TEST(MemoryStore, AllGatherNamesOneMissingRank) {
  MemoryStore store;
  store.set("one/0", "x");
  store.set("one/2", "x");
  const std::string message =
      error_message<CommError>([&] { store_all_gather(store, "one", 1, 4, "v", 100ms, "rendezvous of X"); });
  EXPECT_TRUE(contains(message, "rendezvous of X: rank 3 of 4 did not arrive within 0.1 s")) << message;
}

TEST(MemoryStore, AllGatherRankZeroWaitsUntilEveryoneHasRead) {
  MemoryStore store;
  store.set("read/1", "arrived");  // rank 1 arrived but never finishes reading
  const std::string message =
      error_message<CommError>([&] { store_all_gather(store, "read", 0, 2, "v", 100ms, "rendezvous of X"); });
  EXPECT_TRUE(contains(message, "rendezvous of X: rank 1 of 2 arrived but did not finish reading")) << message;
  // The other ranks do not wait for each other's reading, only rank 0 does.
  store.set("other/0", "zero");
  EXPECT_EQ(store_all_gather(store, "other", 1, 2, "one", 100ms, "X"), (std::vector<std::string>{"zero", "one"}));
  EXPECT_TRUE(store.check("other/done/1"));
}

TEST(MemoryStore, AllGatherChecksRank) {
  MemoryStore store;
  EXPECT_THROW(store_all_gather(store, "p", 4, 4, "v", 100ms, "test"), Error);
  EXPECT_THROW(store_all_gather(store, "p", -1, 4, "v", 100ms, "test"), Error);
}

TEST(MemoryStore, AllGatherOfOne) {
  MemoryStore store;
  EXPECT_EQ(store_all_gather(store, "p", 0, 1, "only", 100ms, "test"), std::vector<std::string>{"only"});
}

// ---- TcpStore ----

const std::string kTestSecret(32, 's');

std::shared_ptr<TcpStore> serve() { return TcpStore::create("127.0.0.1", 0, true, 5s, kTestSecret); }

std::shared_ptr<TcpStore> connect_to(const TcpStore& server) {
  return TcpStore::create("127.0.0.1", server.port(), false, 5s, kTestSecret);
}

TEST(TcpStore, ServerPicksAFreePort) {
  auto server = serve();
  EXPECT_GT(server->port(), 0);
  EXPECT_EQ(server->host(), "127.0.0.1");
}

TEST(TcpStore, SetGetAddCheckOnTheServer) {
  auto server = serve();
  expect_store_semantics(*server);
}

TEST(TcpStore, SetGetAddCheckOnAClient) {
  auto server = serve();
  auto client = connect_to(*server);
  expect_store_semantics(*client);
  EXPECT_EQ(server->get("a/b", 1s), "second");  // one store, seen from both
}

TEST(TcpStore, GetTimeoutNamesKeyAndAddress) {
  auto server = serve();
  auto client = connect_to(*server);
  expect_get_timeout_names_key(*client);
  const std::string message = error_message<CommError>([&] { client->get("k", 0ms); });
  EXPECT_TRUE(contains(message, "127.0.0.1:" + std::to_string(server->port()))) << message;
  client->set("k", "after the timeouts");  // the connection is still good
  EXPECT_EQ(client->get("k", 1s), "after the timeouts");
}

TEST(TcpStore, AllGatherOfServerAndThreeClients) {
  auto server = serve();
  expect_all_gather_in_rank_order(
      [&](int rank) -> std::shared_ptr<Store> { return rank == 0 ? server : connect_to(*server); }, 4);
}

TEST(TcpStore, AllGatherNamesMissingRanks) {
  auto server = serve();
  auto client = connect_to(*server);
  std::string messages[2];
  std::thread other([&] {
    messages[1] = error_message<CommError>([&] { store_all_gather(*client, "partial", 1, 4, "v", 200ms, "R"); });
  });
  messages[0] = error_message<CommError>([&] { store_all_gather(*server, "partial", 0, 4, "v", 200ms, "R"); });
  other.join();
  for (const std::string& message : messages) {
    EXPECT_TRUE(contains(message, "R: ranks 2, 3 of 4 did not arrive within 0.2 s")) << message;
  }
}

// Rank 0 hosts the store and drops it right after its last gather (as a communicator's
// rank 0 does when a short program ends); the slower ranks must still get every value.
void expect_rank_zero_may_drop_the_store_after_gathering(
    const std::function<std::shared_ptr<Store>()>& make_rank_zero_store,
    const std::function<std::shared_ptr<Store>(const Store& rank_zero)>& make_store, int size) {
  for (int round = 0; round < 10; ++round) {
    std::shared_ptr<Store> rank_zero = make_rank_zero_store();
    std::vector<std::shared_ptr<Store>> stores(size);
    stores[0] = rank_zero;
    for (int r = 1; r < size; ++r) stores[r] = make_store(*rank_zero);
    rank_zero.reset();
    std::vector<std::string> errors(size);
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        try {
          // Two gathers, so that the slow ranks are still reading the first one's keys when
          // rank 0 has long been done with the second.
          store_all_gather(*stores[r], "first", r, size, std::string(1000, 'a' + r), 10s, "test");
          if (r != 0) std::this_thread::sleep_for(std::chrono::milliseconds(r));
          const auto values = store_all_gather(*stores[r], "last", r, size, std::to_string(r), 10s, "test");
          if (r == 0) stores[0].reset();  // rank 0's store goes now
          for (int q = 0; q < size; ++q) {
            if (values[q] != std::to_string(q)) errors[r] = "wrong value from rank " + std::to_string(q);
          }
        } catch (const std::exception& error) {
          errors[r] = error.what();
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    for (int r = 0; r < size; ++r) EXPECT_EQ(errors[r], "") << "round " << round << ", rank " << r;
  }
}

TEST(TcpStore, RankZeroMayStopServingRightAfterItsLastGather) {
  expect_rank_zero_may_drop_the_store_after_gathering(
      [] { return serve(); }, [](const Store& server) { return connect_to(dynamic_cast<const TcpStore&>(server)); }, 4);
}

TEST(TcpStore, AWaitingGetDoesNotHoldUpOtherClients) {
  auto server = serve();
  auto waiting = connect_to(*server);
  auto other = connect_to(*server);
  std::string got;
  std::thread waiter([&] { got = waiting->get("late", 20s); });
  // While the get is parked on the server, another client is served, many times over.
  for (int i = 0; i < 50; ++i) {
    other->set("busy", std::to_string(i));
    EXPECT_EQ(other->get("busy", 1s), std::to_string(i));
    EXPECT_EQ(other->add("adds", 1), i + 1);
  }
  EXPECT_FALSE(other->check("late"));
  other->set("late", "answered");
  waiter.join();
  EXPECT_EQ(got, "answered");
}

TEST(TcpStore, ManyWaitersOnOneKey) {
  auto server = serve();
  std::vector<std::shared_ptr<TcpStore>> clients;
  for (int i = 0; i < 6; ++i) clients.push_back(connect_to(*server));
  std::vector<std::string> got(clients.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < clients.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = clients[i]->get("go", 20s); });
  }
  server->set("go", "now");
  for (std::thread& thread : threads) thread.join();
  for (const std::string& value : got) EXPECT_EQ(value, "now");
}

TEST(TcpStore, ConcurrentAddsFromManyClientsCountExactly) {
  auto server = serve();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      auto client = connect_to(*server);
      for (int i = 0; i < 100; ++i) client->add("total", 1);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(server->get("total", 1s), "400");
}

TEST(TcpStore, OneStoreSharedByThreads) {
  auto server = serve();
  auto client = connect_to(*server);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        // Not "t" + to_string(t): GCC 12 at -O3 warns (a bogus -Wrestrict).
        client->set(std::string(1, 't') += std::to_string(t), std::to_string(i));
        client->add("shared", 1);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(client->get("shared", 1s), "200");
  for (int t = 0; t < 4; ++t) EXPECT_EQ(server->get(std::string(1, 't') += std::to_string(t), 1s), "49");
}

TEST(TcpStore, ConnectTimeoutNamesHostAndPort) {
  // A socket bound but not listening: connections to its port are refused, and the port
  // stays ours for the whole test.
  const int blocker = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(blocker, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(blocker, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  socklen_t length = sizeof address;
  ::getsockname(blocker, reinterpret_cast<sockaddr*>(&address), &length);
  const int port = ntohs(address.sin_port);

  const std::string message =
      error_message<CommError>([&] { TcpStore::create("127.0.0.1", port, false, 200ms, kTestSecret); });
  EXPECT_TRUE(contains(message, "cannot reach the rendezvous store at 127.0.0.1:" + std::to_string(port))) << message;
  EXPECT_TRUE(contains(message, "within 0.2 s")) << message;
  EXPECT_TRUE(contains(message, "MASTER_ADDR/MASTER_PORT")) << message;
  ::close(blocker);
}

TEST(TcpStore, ClientWaitsForALateServer) {
  // Find a free port, then start serving on it only after the client began retrying.
  int port = 0;
  {
    auto probe = serve();
    port = probe->port();
  }
  std::shared_ptr<TcpStore> server;
  std::string error;
  std::thread starter([&] {
    std::this_thread::sleep_for(150ms);
    try {
      server = TcpStore::create("127.0.0.1", port, true, 5s, kTestSecret);
      server->set("hello", "world");
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  auto client = TcpStore::create("127.0.0.1", port, false, 20s, kTestSecret);
  EXPECT_EQ(client->get("hello", 20s), "world");
  starter.join();
  EXPECT_EQ(error, "");
}

TEST(TcpStore, PortInUseSaysSoAndSuggestsMasterPort) {
  auto server = serve();
  const std::string message =
      error_message<CommError>([&] { TcpStore::create("127.0.0.1", server->port(), true, 1s, kTestSecret); });
  EXPECT_TRUE(contains(message, "port " + std::to_string(server->port()))) << message;
  EXPECT_TRUE(contains(message, "in use")) << message;
  EXPECT_TRUE(contains(message, "MASTER_PORT")) << message;
  server->set("still", "serving");
  EXPECT_EQ(server->get("still", 1s), "serving");
}

TEST(TcpStore, ClientOfAStoppedServerGetsCommErrorNamingAddress) {
  auto server = serve();
  const std::string address = "127.0.0.1:" + std::to_string(server->port());
  auto client = connect_to(*server);
  client->set("before", "ok");
  server.reset();
  const std::string message = error_message<CommError>([&] { client->get("before", 1s); });
  EXPECT_TRUE(contains(message, address)) << message;
  EXPECT_TRUE(contains(message, "rank 0")) << message;
  // Every later call fails the same way, at once.
  EXPECT_EQ(error_message<CommError>([&] { client->set("after", "x"); }), message);
}

TEST(TcpStore, ServerStoppingWakesAParkedGet) {
  auto server = serve();
  auto client = connect_to(*server);
  std::string message;
  std::thread waiter([&] { message = error_message<CommError>([&] { client->get("never", 60s); }); });
  // Most likely parked on the server by then; if not, it meets a closed port instead.
  std::this_thread::sleep_for(50ms);
  server.reset();
  waiter.join();
  EXPECT_TRUE(contains(message, "127.0.0.1:")) << message;
}

// A raw connection to the store's port.
int connect_raw(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  return fd;
}

// Everything the peer sends until it closes the connection.
std::string read_to_end(int fd) {
  std::string all;
  char buffer[4096];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;) all.append(buffer, static_cast<size_t>(n));
  return all;
}

TEST(TcpStore, AStrangerOnThePortDoesNotDisturbTheStore) {
  auto server = serve();
  server->set("lockstep/world/names", "rank 0's segments");
  // An HTTP probe, and a client that skips the handshake and asks for a key at once: each
  // gets the challenge and is hung up on, never a value.
  const std::string probe = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string get = tcp::FrameWriter().u8(uint8_t(tcp::Op::get)).str("lockstep/world/names").i64(0).finish();
  for (const std::string& request : {probe, get}) {
    const int stranger = connect_raw(server->port());
    ASSERT_EQ(::send(stranger, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
    const std::string heard = read_to_end(stranger);
    ::close(stranger);
    EXPECT_EQ(heard.size(), tcp::kLengthBytes + 1 + 4 + tcp::kNonceBytes) << "only the challenge";
    EXPECT_EQ(heard.find("segments"), std::string::npos);
  }
  auto client = connect_to(*server);
  client->set("fine", "yes");
  EXPECT_EQ(server->get("fine", 1s), "yes");
}

// A rank without the job's secret is refused with a message that says why, and a client
// that answers the challenge with a made-up proof never reaches a key; the store serves on.
TEST(TcpStore, ARankWithoutTheJobsSecretIsRefused) {
  auto server = serve();
  server->set("key", "secret value");
  const std::string message =
      error_message<CommError>([&] { TcpStore::create("127.0.0.1", server->port(), false, 2s, std::string(32, 'x')); });
  EXPECT_TRUE(contains(message, "refused this rank")) << message;
  EXPECT_TRUE(contains(message, "LOCKSTEP_JOB_SECRET")) << message;

  const int forger = connect_raw(server->port());
  std::string challenge(tcp::kLengthBytes + 1 + 4 + tcp::kNonceBytes, '\0');
  ASSERT_EQ(::recv(forger, challenge.data(), challenge.size(), MSG_WAITALL), static_cast<ssize_t>(challenge.size()));
  const std::string answer = tcp::FrameWriter().str(std::string(32, 'n')).str(std::string(32, 'p')).finish();
  ::send(forger, answer.data(), answer.size(), MSG_NOSIGNAL);
  const std::string get = tcp::FrameWriter().u8(uint8_t(tcp::Op::get)).str("key").i64(0).finish();
  ::send(forger, get.data(), get.size(), MSG_NOSIGNAL);
  EXPECT_EQ(read_to_end(forger), "");
  ::close(forger);
  EXPECT_EQ(connect_to(*server)->get("key", 1s), "secret value");
}

// A server that does not hold the secret (another program on MASTER_PORT, or one posing as
// rank 0's) is not trusted: the client stops before sending any key.
TEST(TcpStore, AServerWithoutTheJobsSecretIsNotTrusted) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  socklen_t length = sizeof address;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);
  std::thread impostor([&] {
    const int fd = ::accept(listener, nullptr, nullptr);
    const std::string challenge = tcp::FrameWriter().u8(tcp::kHandshakeVersion).str(std::string(32, 'c')).finish();
    ::send(fd, challenge.data(), challenge.size(), MSG_NOSIGNAL);
    std::string answer(tcp::kLengthBytes + 4 + 32 + 4 + 32, '\0');
    ::recv(fd, answer.data(), answer.size(), MSG_WAITALL);
    const std::string proof = tcp::FrameWriter().str(std::string(32, 'f')).finish();
    ::send(fd, proof.data(), proof.size(), MSG_NOSIGNAL);
    read_to_end(fd);
    ::close(fd);
  });
  const std::string message =
      error_message<CommError>([&] { TcpStore::create("127.0.0.1", ntohs(address.sin_port), false, 2s, kTestSecret); });
  impostor.join();
  ::close(listener);
  EXPECT_TRUE(contains(message, "did not prove it holds the job's secret")) << message;
}

TEST(TcpStore, TwoProcesses) {
  auto server = serve();
  const int port = server->port();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child has no threads of its own and leaves with _exit: nothing of the parent's
    // store (its server thread does not exist here) is touched or destroyed.
    int code = 1;
    try {
      auto client = TcpStore::create("127.0.0.1", port, false, 10s, kTestSecret);
      const auto values = store_all_gather(*client, "procs", 1, 2, "child-" + std::to_string(::getpid()), 10s, "t");
      client->add("done", 1);
      code = values[0] == "parent" ? 0 : 2;
    } catch (...) {
      code = 3;
    }
    ::_exit(code);
  }
  const auto values = store_all_gather(*server, "procs", 0, 2, "parent", 10s, "test");
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(values, (std::vector<std::string>{"parent", "child-" + std::to_string(child)}));
  EXPECT_EQ(server->get("done", 1s), "1");
}

TEST(TcpStore, RejectsBadPorts) {
  EXPECT_THROW(TcpStore::create("127.0.0.1", 0, false, 100ms, kTestSecret), Error);
  EXPECT_THROW(TcpStore::create("127.0.0.1", 65536, true, 100ms, kTestSecret), Error);
  EXPECT_THROW(TcpStore::create("127.0.0.1", -1, true, 100ms, kTestSecret), Error);
}

TEST(TcpStore, UnknownHostIsNamed) {
  const std::string message =
      error_message<CommError>([&] { TcpStore::create("no-such-host.invalid", 29500, false, 200ms, kTestSecret); });
  EXPECT_TRUE(contains(message, "no-such-host.invalid")) << message;
  EXPECT_TRUE(contains(message, "MASTER_ADDR")) << message;
}

// ---- FileStore ----

TEST(FileStore, SetGetAddCheck) {
  TempDir dir;
  FileStore store(dir.path());
  expect_store_semantics(store);
  // Keys with '/' are single files in the directory, not subdirectories.
  EXPECT_TRUE(exists(dir.path() + "/k-a%2Fb"));
}

TEST(FileStore, GetTimeoutNamesKeyAndDirectory) {
  TempDir dir;
  FileStore store(dir.path());
  expect_get_timeout_names_key(store);
  const std::string message = error_message<CommError>([&] { store.get("k", 0ms); });
  EXPECT_TRUE(contains(message, dir.path())) << message;
}

TEST(FileStore, AllGatherAcrossThreadsWithStoresOfTheirOwn) {
  TempDir dir;
  expect_all_gather_in_rank_order([&](int) { return std::make_shared<FileStore>(dir.path()); }, 4);
}

TEST(FileStore, AllGatherNamesMissingRanks) {
  TempDir dir;
  FileStore store(dir.path());
  expect_all_gather_names_missing_ranks(store);
}

TEST(FileStore, ConcurrentAddsCountExactly) {
  TempDir dir;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      FileStore store(dir.path());
      for (int i = 0; i < 50; ++i) store.add("total", 1);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(FileStore(dir.path()).get("total", 1s), "200");
}

TEST(FileStore, TwoProcesses) {
  TempDir dir;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int code = 1;
    try {
      FileStore store(dir.path());
      const auto values = store_all_gather(store, "procs", 1, 2, "child", 10s, "t");
      code = values[0] == "parent" ? 0 : 2;
    } catch (...) {
      code = 3;
    }
    ::_exit(code);
  }
  FileStore store(dir.path());
  const auto values = store_all_gather(store, "procs", 0, 2, "parent", 10s, "test");
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(values, (std::vector<std::string>{"parent", "child"}));
}

TEST(FileStore, RemoveDirectoryRemovesWhatTheStoreWrote) {
  TempDir parent;
  const std::string path = parent.path() + "/rendezvous";
  {
    FileStore store(path);
    store.set("a/b", "x");
    store.add("n", 1);
    EXPECT_TRUE(exists(path + "/lock"));
    store.remove_directory();
    EXPECT_FALSE(exists(path));
  }
  {
    FileStore owner(path, /*remove_on_destroy=*/true);
    FileStore other(path);
    other.set("k", "v");
    EXPECT_EQ(owner.get("k", 1s), "v");
  }
  EXPECT_FALSE(exists(path));
}

// A job whose rank 0 was killed leaves its keys; a later job of the same id (so the same
// directory) must not read them. One that is still running keeps them.
TEST(FileStore, ADirectoryLeftByEndedProcessesIsEmptiedFirst) {
  TempDir parent;
  const std::string path = parent.path() + "/rendezvous";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    FileStore store(path);  // the earlier job: a rank that signs in, writes and dies
    store.set("lockstep/world/names", "stale");
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(exists(path + "/k-lockstep%2Fworld%2Fnames"));
  FileStore later(path);
  EXPECT_FALSE(later.check("lockstep/world/names")) << "a later job read the ended job's key";
  later.set("ours", "1");
  FileStore joining(path);  // a rank of the same, live job: keeps what the first wrote
  EXPECT_EQ(joining.get("ours", 1s), "1");
}

TEST(FileStore, RankZeroMayRemoveTheDirectoryRightAfterItsLastGather) {
  TempDir parent;
  const std::string path = parent.path() + "/rendezvous";
  expect_rank_zero_may_drop_the_store_after_gathering(
      [&] { return std::make_shared<FileStore>(path, /*remove_on_destroy=*/true); },
      [&](const Store&) { return std::make_shared<FileStore>(path); }, 4);
  EXPECT_FALSE(exists(path));
}

TEST(FileStore, RemoveDirectoryLeavesOtherFiles) {
  TempDir dir;
  {
    FileStore store(dir.path(), /*remove_on_destroy=*/true);
    store.set("k", "v");
    std::system(("touch '" + dir.path() + "/not-ours'").c_str());
  }
  EXPECT_TRUE(exists(dir.path() + "/not-ours"));
  EXPECT_FALSE(exists(dir.path() + "/k-k"));
}

TEST(FileStore, RefusesAPathThatIsNotADirectory) {
  TempDir dir;
  const std::string file = dir.path() + "/file";
  std::system(("touch '" + file + "'").c_str());
  const std::string message = error_message<Error>([&] { FileStore store(file); });
  EXPECT_TRUE(contains(message, "not a directory")) << message;
}

}  // namespace
}  // namespace lockstep::comm
