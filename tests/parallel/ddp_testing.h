// For the tests of distributed data parallelism and ZeRO: a few steps on ranks as threads,
// and the same steps through DataParallel, each returning the weights they end with.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "lockstep/nn/models.h"
#include "lockstep/optim/adamw.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/parallel/data_parallel.h"
#include "lockstep/parallel/distributed_data_parallel.h"
#include "parallel/rank_threads.h"
#include "parallel/step_testing.h"

namespace lockstep::parallel::ddp_testing {

using namespace step_testing;

inline std::unique_ptr<optim::Optimizer> sgd(std::vector<Tensor> params) {
  return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
}

inline std::unique_ptr<optim::Optimizer> adamw(std::vector<Tensor> params) {
  return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions{.lr = 1e-3, .weight_decay = 0.1});
}

// `steps` DDP steps of a global batch on `ranks` ranks; every rank's final weights. Each
// rank builds its model from its own seed: the broadcast must make them rank 0's.
inline std::vector<Weights> train_ddp(const std::string& model_name, int ranks, int64_t batch, int64_t micro, int steps,
                                      DistributedDataParallelOptions options = {},
                                      const OptimizerFactory& make_optimizer = sgd) {
  options.loss = classification();
  options.micro_batch = micro;
  std::vector<Weights> out(static_cast<size_t>(ranks));
  const auto errors = rank_threads::run_ranks(ranks, [&](int rank, std::shared_ptr<comm::Communicator> comm) {
    auto model = nn::make_model(model_name, kSeed + static_cast<uint64_t>(rank));
    DistributedDataParallel ddp(model, make_optimizer, comm, options);
    const int64_t share = batch / ranks;
    for (int s = 0; s < steps; ++s) {
      const Data data = synthetic(batch, static_cast<uint64_t>(s));
      // The share as a program that loads only its own rows would pass it.
      ddp.step_on_share(as_batch(data).slice(rank * share, share),
                        {.seed = kSeed, .step = static_cast<uint64_t>(s), .first_sample = s * batch + rank * share});
    }
    out[static_cast<size_t>(rank)] = weights(ddp.model());  // gathered under ZeRO-3
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  return out;
}

inline Weights train_dp(const std::string& model_name, int devices, int64_t batch, int64_t micro, int steps,
                        const OptimizerFactory& make_optimizer = sgd) {
  DataParallel dp(
      {.loss = classification(), .devices = devices, .micro_batch = micro},
      [&](int) { return nn::make_model(model_name, kSeed); }, make_optimizer);
  for (int s = 0; s < steps; ++s) {
    const Data data = synthetic(batch, static_cast<uint64_t>(s));
    train_step(dp, data, s * batch, static_cast<uint64_t>(s));
  }
  return weights(dp.replica(0));
}

}  // namespace lockstep::parallel::ddp_testing
