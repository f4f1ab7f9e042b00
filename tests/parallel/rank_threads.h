// For the tests of parallel layouts: ranks as threads over one `local` group, and float32
// results compared with the unsplit computation's.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/comm/local_communicator.h"
#include "lockstep/core/parallel.h"
#include "lockstep/core/tensor.h"

namespace lockstep::rank_threads {

// Runs body(rank, comm) on `ranks` threads (one compute thread each) over one local group;
// returns each rank's error text, empty where it succeeded.
template <typename Body>
std::vector<std::string> run_ranks(int ranks, const Body& body) {
  const auto comms = comm::LocalCommunicator::create_group(ranks);
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      set_num_threads(1);
      try {
        body(r, comms[static_cast<size_t>(r)]);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

inline void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// Every f32 element within tolerance · (1 + |expected|): a layout that sums partial
// products in another order rounds differently.
inline void expect_close(const Tensor& actual, const Tensor& expected, const std::string& what,
                         double tolerance = 1e-5) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const auto a = actual.contiguous().to_vector<float>(), e = expected.contiguous().to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], e[i], tolerance * (1 + std::abs(e[i]))) << what << " [" << i << "]";
  }
}

}  // namespace lockstep::rank_threads
