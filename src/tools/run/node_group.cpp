#include "tools/run/node_group.h"

#include <thread>

#include "lockstep/comm/communicator.h"
#include "lockstep/comm/flight_recorder.h"
#include "lockstep/comm/tcp_store.h"
#include "lockstep/core/error.h"

namespace lockstep::tools {
namespace {

// A node whose launcher has not said it is alive for this long has failed (its host went
// down, or its launcher was killed and the keeper took its workers with it).
constexpr int64_t kSilentMs = 15000;

}  // namespace

NodeGroup::NodeGroup(int nodes, int node_rank, const std::string& master_addr, int master_port,
                     const std::string& secret, std::chrono::milliseconds timeout)
    : nodes_(nodes), node_rank_(node_rank), timeout_(timeout) {
  try {
    store_ = comm::TcpStore::create(master_addr, master_port + 1, node_rank == 0, timeout, secret);
  } catch (const Error& e) {
    LOCKSTEP_FAIL() << "node " << node_rank << " cannot meet the other nodes' launchers at " << master_addr << ":"
                    << master_port + 1 << " (--master-port + 1): " << e.what();
  }
}

std::string NodeGroup::key(int64_t attempt, const std::string& name) const {
  return "lockstep-run/attempt" + std::to_string(attempt) + "/" + name;
}

void NodeGroup::join(int64_t attempt) {
  store_->set("lockstep-run/node" + std::to_string(node_rank_) + "/alive", std::to_string(comm::unix_ms_now()));
  store_->add(key(attempt, "joined"), 1);
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (;;) {
    const int64_t joined = store_->add(key(attempt, "joined"), 0);
    if (joined >= nodes_) return;
    LOCKSTEP_CHECK(std::chrono::steady_clock::now() < deadline)
        << "only " << joined << " of " << nodes_ << " nodes' launchers came within "
        << std::chrono::duration_cast<std::chrono::seconds>(timeout_).count() << " s: start `lockstep run --nnodes "
        << nodes_ << " --node-rank R ...` on every node, R from 0 to " << nodes_ - 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::string NodeGroup::check(int64_t attempt) {
  try {
    const int64_t now = comm::unix_ms_now();
    store_->set("lockstep-run/node" + std::to_string(node_rank_) + "/alive", std::to_string(now));
    if (store_->check(key(attempt, "failed"))) return store_->get(key(attempt, "failed"), timeout_);
    if (node_rank_ != 0) return "";
    for (int node = 1; node < nodes_; ++node) {
      const std::string alive = store_->get("lockstep-run/node" + std::to_string(node) + "/alive", timeout_);
      const int64_t silent = now - std::stoll(alive);
      if (silent > kSilentMs) {
        const std::string what =
            "node " + std::to_string(node) + "'s launcher has not answered for " + std::to_string(silent / 1000) + " s";
        fail(attempt, what);
        return what;
      }
    }
    return "";
  } catch (const comm::CommError& e) {
    return "node 0's launcher is gone (" + std::string(e.what()) + ")";
  }
}

void NodeGroup::fail(int64_t attempt, const std::string& what) {
  try {
    if (store_->add(key(attempt, "failures"), 1) == 1) store_->set(key(attempt, "failed"), what);
  } catch (const comm::CommError&) {
    // Node 0's launcher is gone: its workers went with it, and every node learns that anyway.
  }
}

std::string NodeGroup::finish(int64_t attempt, bool ok) {
  std::string result;
  try {
    store_->add(key(attempt, "finished"), 1);
    while (store_->add(key(attempt, "finished"), 0) < nodes_) {
      // A node that failed has said so (fail()) and finishes too; one that stopped answering
      // is failed by node 0's check, which then waits for the rest no longer.
      const std::string failure = check(attempt);
      if (failure.rfind("node 0's launcher is gone", 0) == 0 || failure.find("has not answered") != std::string::npos)
        return failure;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (store_->check(key(attempt, "failed"))) result = store_->get(key(attempt, "failed"), timeout_);
    if (result.empty() && !ok) result = "node " + std::to_string(node_rank_) + "'s workers failed";
    // Node 0 serves the store until every node has read how the attempt ended.
    store_->add(key(attempt, "left"), 1);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (node_rank_ == 0 && store_->add(key(attempt, "left"), 0) < nodes_ &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const comm::CommError& e) {
    if (result.empty()) result = "node 0's launcher is gone (" + std::string(e.what()) + ")";
  }
  return result;
}

}  // namespace lockstep::tools
