// The launchers of a job that spans nodes (`lockstep run --nnodes N --node-rank R
// --master-addr HOST --master-port P`, torchrun's multi-node form): node 0's launcher serves
// a store at HOST:P+1 (the workers' rank 0 serves theirs at P) that the others connect to,
// every connection proving it holds the job's secret. Through it the launchers start each
// attempt together, hear of a failure on any node at once, notice a node whose launcher
// stops answering, and leave only when every node is done.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "lockstep/comm/store.h"

namespace lockstep::tools {

class NodeGroup {
 public:
  // Serves (node 0) or connects to (the others, retrying for `timeout` while node 0 starts)
  // the launchers' store.
  NodeGroup(int nodes, int node_rank, const std::string& master_addr, int master_port, const std::string& secret,
            std::chrono::milliseconds timeout);

  int nodes() const { return nodes_; }
  int node_rank() const { return node_rank_; }

  // Waits until every node's launcher has come to `attempt`; an Error naming how many did
  // after the timeout.
  void join(int64_t attempt);
  // Says this node is alive, and returns what ended the attempt elsewhere: another node's
  // failure, a node whose launcher has not answered for a while, or node 0's launcher gone;
  // "" while all is well. About once a second.
  std::string check(int64_t attempt);
  // This node's workers failed: every other node stops its own at its next check().
  void fail(int64_t attempt, const std::string& what);
  // This node's workers have ended (ok: all succeeded). Waits until every node's have, and
  // returns what failed the attempt anywhere ("" when nothing did). Node 0's store thus
  // outlives the others' last calls.
  std::string finish(int64_t attempt, bool ok);

 private:
  std::string key(int64_t attempt, const std::string& name) const;

  int nodes_;
  int node_rank_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<comm::Store> store_;
};

}  // namespace lockstep::tools
