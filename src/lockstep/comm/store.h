// A key-value store every rank of a job can reach: how ranks find each other before any
// collective exists (segment names, NCCL's unique id, host names), as in torch's c10d
// stores. MemoryStore serves threads of one process; TcpStore (tcp_store.h) and FileStore
// (file_store.h) serve processes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace lockstep::comm {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits until key is set, up to timeout; then throws CommError naming the key.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Adds delta to the integer at key (0 if unset) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Whether key is set now (no waiting).
  virtual bool check(const std::string& key) = 0;
};

class MemoryStore : public Store {
 public:
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::string& key) override;

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
};

// Every rank sets "<prefix>/<rank>" = value and waits for the others' values, which it
// returns in rank order. On timeout, throws CommError naming the ranks that never arrived
// and `what` ("rendezvous of the shm backend"). Then each rank but 0 sets
// "<prefix>/done/<rank>" and rank 0 waits for those: when rank 0 returns, no rank will
// touch this gather's keys again, so rank 0 (whose store the others' depend on) may drop
// its store right after its last gather.
std::vector<std::string> store_all_gather(Store& store, const std::string& prefix, int rank, int size,
                                          const std::string& value, std::chrono::milliseconds timeout,
                                          const std::string& what);

namespace detail {

// How the stores' messages print a duration: "10", "0.25".
std::string seconds_text(std::chrono::milliseconds duration);
// Timeouts past a year are clamped, so that now + timeout cannot overflow a time_point.
std::chrono::milliseconds clamp_timeout(std::chrono::milliseconds timeout);
// "timed out after 0.2 s waiting for key 'k' in the store<where>": one wording for all stores.
std::string key_timeout_message(const std::string& key, std::chrono::milliseconds timeout, const std::string& where);
// Parses a counter value for add(); throws Error naming the key when it is not an integer.
int64_t parse_counter(const std::string& key, const std::string& value);

}  // namespace detail

}  // namespace lockstep::comm
