// The hierarchical all-reduce, with hosts played by groups of threads: the conformance
// suite on several host layouts, and on irregular data of every dtype and reduction the
// same bits as the flat group's all_reduce.
#include "lockstep/comm/hierarchical_communicator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include "comm/conformance.h"
#include "lockstep/comm/local_communicator.h"

namespace lockstep::comm {
namespace {

struct HostLayout {
  int hosts;
  int per_host;
};

// Runs body(flat, hierarchical) on one thread per rank of `hosts` x `per_host` ranks.
template <typename Body>
void run_hosts(HostLayout layout, Body body) {
  const int size = layout.hosts * layout.per_host;
  std::vector<std::shared_ptr<Communicator>> comms = LocalCommunicator::create_group(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      std::shared_ptr<Communicator> flat = comms[static_cast<size_t>(r)];
      std::shared_ptr<Communicator> local = flat->split(r / layout.per_host, r);
      std::shared_ptr<Communicator> cross = flat->split(r % layout.per_host, r);
      HierarchicalCommunicator hierarchical(flat, local, cross);
      body(*flat, hierarchical);
    });
  }
  for (auto& t : threads) t.join();
}

class HierarchicalConformance : public ::testing::TestWithParam<HostLayout> {};

TEST_P(HierarchicalConformance, AllCollectives) {
  run_hosts(GetParam(), [](Communicator&, HierarchicalCommunicator& comm) { testing::run_conformance(comm); });
}

// Irregular values, so any other order or rounding shows: every dtype and reduction, on
// sizes around the slices' 64-byte boundaries, against the flat group's own all_reduce.
TEST_P(HierarchicalConformance, SameBitsAsTheFlatTree) {
  run_hosts(GetParam(), [](Communicator& flat, HierarchicalCommunicator& comm) {
    for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min, ReduceOp::rounded_sum}) {
        if (op == ReduceOp::avg && !is_floating(dtype)) continue;
        for (int64_t count : {int64_t{1}, int64_t{33}, int64_t{5003}}) {
          std::mt19937 random(static_cast<unsigned>(comm.rank() * 7919 + count));
          std::uniform_real_distribution<float> uniform(-100.0f, 100.0f);
          std::vector<float> values(static_cast<size_t>(count));
          for (float& v : values) v = uniform(random) * (1.0f + static_cast<float>(comm.rank()) / 3.0f);
          Tensor ours = Tensor::empty({count}, dtype);
          convert_elements(values.data(), DType::f32, ours.raw_data(), dtype, count);
          Tensor reference = Tensor::empty({count}, dtype);
          std::memcpy(reference.raw_data(), ours.raw_data(), static_cast<size_t>(count) * dtype_size(dtype));
          comm.all_reduce(ours, op);
          flat.all_reduce(reference, op);
          EXPECT_EQ(std::memcmp(ours.raw_data(), reference.raw_data(), static_cast<size_t>(count) * dtype_size(dtype)),
                    0)
              << dtype_name(dtype) << " " << reduce_op_name(op) << " of " << count << " on rank " << comm.rank();
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, HierarchicalConformance,
                         ::testing::Values(HostLayout{2, 2}, HostLayout{3, 2}, HostLayout{2, 4}, HostLayout{3, 1},
                                           HostLayout{1, 4}),
                         [](const auto& info) {
                           return std::to_string(info.param.hosts) + "hosts_x" + std::to_string(info.param.per_host);
                         });

// Each rank's error (empty if none) from making a hierarchical group over `size` threads
// whose local groups are split by host_of(rank) and cross groups by local_of(rank).
template <typename HostOf, typename LocalOf>
std::vector<std::string> construction_errors(int size, HostOf host_of, LocalOf local_of) {
  std::vector<std::shared_ptr<Communicator>> comms = LocalCommunicator::create_group(size);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      std::shared_ptr<Communicator> flat = comms[static_cast<size_t>(r)];
      std::shared_ptr<Communicator> local = flat->split(host_of(r), r);
      std::shared_ptr<Communicator> cross = flat->split(local_of(r), r);
      try {
        HierarchicalCommunicator hierarchical(flat, local, cross);
      } catch (const Error& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Three ranks per host would make each host's sum a subtree the flat tree does not have.
TEST(HierarchicalCommunicator, RefusesRanksPerHostThatAreNotAPowerOfTwo) {
  for (const std::string& error : construction_errors(
           6, [](int r) { return r / 3; }, [](int r) { return r % 3; })) {
    EXPECT_NE(error.find("power of two ranks per host"), std::string::npos) << error;
    EXPECT_NE(error.find("got 3"), std::string::npos) << error;
  }
}

// Hosts must hold consecutive ranks: round-robin placement (hosts {0, 2} and {1, 3}) is
// refused, not folded out of order. Ranks 1 and 2 see it; 0 and 3 sit where they would.
TEST(HierarchicalCommunicator, RefusesHostsOfScatteredRanks) {
  const std::vector<std::string> errors = construction_errors(
      4, [](int r) { return r % 2; }, [](int r) { return r / 2; });
  for (int r = 1; r < 3; ++r) {
    EXPECT_NE(errors[static_cast<size_t>(r)].find("hosts of consecutive ranks"), std::string::npos)
        << errors[static_cast<size_t>(r)];
  }
}

}  // namespace
}  // namespace lockstep::comm
