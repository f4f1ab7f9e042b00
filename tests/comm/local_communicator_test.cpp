// The local backend: ranks as threads. The conformance suite on world sizes 1 to 8, then
// the failure paths: a mismatch named on every rank, a rank that never arrives, a rank
// that leaves.
#include "lockstep/comm/local_communicator.h"

#include <gtest/gtest.h>

#include <thread>

#include "comm/conformance.h"
#include "lockstep/core/allocator.h"
#include "testing/devices.h"

namespace lockstep::comm {
namespace {

// Runs body(comm) on one thread per rank of a new local group.
template <typename Body>
void run_ranks(int size, Body body) {
  std::vector<std::shared_ptr<Communicator>> comms = LocalCommunicator::create_group(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] { body(*comms[r]); });
  }
  for (auto& t : threads) t.join();
}

class LocalConformance : public ::testing::TestWithParam<int> {};

TEST_P(LocalConformance, AllCollectives) {
  run_ranks(GetParam(), [](Communicator& comm) { testing::run_conformance(comm); });
}

// Both all_reduce algorithms on every size: each rank folding everything, and one slice
// per rank (slices of a few elements, many of them empty).
TEST(LocalCommunicator, EitherAllReduceAlgorithmOnEverySize) {
  for (size_t direct_bytes : {size_t{0}, size_t{1} << 40}) {
    run_ranks(5, [&](Communicator& comm) {
      dynamic_cast<OneHostCommunicator&>(comm).set_direct_all_reduce_bytes(direct_bytes);
      testing::check_all_reduce_exact(comm);
      testing::check_all_reduce_tree_order(comm);
    });
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, LocalConformance, ::testing::Range(1, 9),
                         [](const auto& info) { return "ranks" + std::to_string(info.param); });

TEST(LocalCommunicator, MismatchIsNamedOnEveryRank) {
  run_ranks(3, [](Communicator& comm) { testing::check_mismatch_is_named(comm); });
}

TEST(LocalCommunicator, FailedCommunicatorRefusesLaterCalls) {
  run_ranks(2, [](Communicator& comm) {
    testing::check_mismatch_is_named(comm);
    Tensor t = Tensor::zeros({4});
    EXPECT_THROW(comm.all_reduce(t), CommError);
  });
}

TEST(LocalCommunicator, MissingRankTimesOutNamingIt) {
  std::vector<std::shared_ptr<Communicator>> comms = LocalCommunicator::create_group(3);
  std::string errors[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      comms[r]->set_timeout(std::chrono::milliseconds(300));
      Tensor t = Tensor::ones({100});
      try {
        comms[r]->all_reduce(t);
      } catch (const CommError& error) {
        errors[r] = error.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  // Whoever timed out first names rank 2; the other may instead report that rank failing.
  bool named = false;
  for (const std::string& e : errors) {
    ASSERT_FALSE(e.empty());
    EXPECT_NE(e.find("all_reduce #1"), std::string::npos) << e;
    named = named || e.find("for rank 2 of 3") != std::string::npos || e.find("ranks 2 of 3") != std::string::npos;
  }
  EXPECT_TRUE(named) << errors[0] << "\n" << errors[1];
}

TEST(LocalCommunicator, RankThatLeavesFailsThePeersAtOnce) {
  std::vector<std::shared_ptr<Communicator>> comms = LocalCommunicator::create_group(2);
  comms[0]->set_timeout(std::chrono::minutes(5));  // the failure must not wait for this
  std::thread leaver([&] { comms[1].reset(); });
  Tensor t = Tensor::ones({100});
  const auto start = std::chrono::steady_clock::now();
  try {
    comms[0]->all_reduce(t);
    ADD_FAILURE() << "all_reduce with a departed rank returned";
  } catch (const CommError& error) {
    EXPECT_NE(std::string(error.what()).find("rank 1 of 2 left the group"), std::string::npos) << error.what();
  }
  leaver.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::minutes(1));
}

TEST(LocalCommunicator, RecvChecksTheSendersTagAndSize) {
  run_ranks(2, [](Communicator& comm) {
    if (comm.rank() == 0) {
      comm.send(Tensor::ones({5}), 1, 3);
    } else {
      Tensor t = Tensor::zeros({6});
      try {
        comm.recv(t, 0, 3);
        ADD_FAILURE() << "recv of the wrong size succeeded";
      } catch (const CommError& error) {
        EXPECT_NE(std::string(error.what()).find("rank 0 sent tag 3, 5 f32"), std::string::npos) << error.what();
      }
    }
  });
}

// An async call keeps its tensors until it has run, not until the next call: a pipeline
// that sends an activation and drops it must get the memory back.
TEST(LocalCommunicator, AsyncCallsReleaseTheirTensorsOnceDone) {
  const Device device = Device::cpu(5);  // no other test allocates here
  run_ranks(2, [&](Communicator& comm) {
    if (comm.rank() == 0) {
      const int64_t before = memory_stats(device).allocated_bytes;
      {
        const Tensor activation = Tensor::ones({1 << 18}, DType::f32, device);
        comm.send_async(activation, 1).wait();
        comm.all_reduce_async(activation).wait();
      }
      EXPECT_EQ(memory_stats(device).allocated_bytes, before);
    } else {
      const Tensor buffer = Tensor::empty({1 << 18});
      comm.recv(buffer, 0);
      comm.all_reduce(buffer);
    }
  });
}

// Ranks whose tensors live on GPU devices (logical ones may share a GPU) meet over host
// memory: each call stages them through the host and back, with the same results.
TEST(LocalCommunicator, CudaTensorsTravelThroughTheHost) {
  const int n = 2;
  LOCKSTEP_SKIP_UNLESS_DEVICE(Device(DeviceType::cuda, n - 1), n);
  run_ranks(n, [&](Communicator& comm) {
    const Device device(DeviceType::cuda, comm.rank());
    const double mine = comm.rank() + 0.25;
    const Tensor summed = Tensor::full({1000}, mine, DType::f32, device);
    comm.all_reduce(summed);
    EXPECT_EQ(summed.device(), device);
    EXPECT_EQ(summed.to_vector<float>(), std::vector<float>(1000, 1.5f));
    const Tensor loss = Tensor::full({1}, mine, DType::f64, device);
    comm.all_reduce(loss, ReduceOp::max);
    EXPECT_EQ(loss.to_vector<double>(), std::vector<double>{1.25});
    const Tensor root = Tensor::full({3}, comm.rank() == 1 ? 2.5 : 0.0, DType::f32, device);
    comm.broadcast(root, 1);
    EXPECT_EQ(root.to_vector<float>(), std::vector<float>(3, 2.5f));
    const Tensor gathered = Tensor::empty({2 * n}, DType::f32, device);
    comm.all_gather(Tensor::full({2}, mine, DType::f32, device), gathered);
    EXPECT_EQ(gathered.to_vector<float>(), (std::vector<float>{0.25f, 0.25f, 1.25f, 1.25f}));
    const Tensor scattered = Tensor::empty({2}, DType::f32, device);
    comm.reduce_scatter(Tensor::full({2 * n}, mine, DType::f32, device), scattered);
    EXPECT_EQ(scattered.to_vector<float>(), std::vector<float>(2, 1.5f));
    // A message between two GPU devices, sent asynchronously as a pipeline stage sends.
    const Tensor message = Tensor::full({1 << 16}, comm.rank() == 0 ? 3.0 : 0.0, DType::f32, device);
    if (comm.rank() == 0) comm.send_async(message, 1, 7).wait();
    if (comm.rank() == 1) comm.recv(message, 0, 7);
    EXPECT_EQ(message.to_vector<float>(), std::vector<float>(1 << 16, 3.0f)) << "rank " << comm.rank();
  });
}

TEST(LocalCommunicator, RejectsBadArgumentsBeforeCommunicating) {
  std::vector<std::shared_ptr<Communicator>> comms = LocalCommunicator::create_group(2);
  Communicator& comm = *comms[0];
  Tensor strided = Tensor::zeros({4, 4}).as_strided({4}, {4}, 0);
  EXPECT_THROW(comm.all_reduce(strided), Error);
  EXPECT_THROW(comm.broadcast(Tensor::zeros({3}), 2), Error);
  EXPECT_THROW(comm.send(Tensor::zeros({3}), 0), Error);
  EXPECT_THROW(comm.all_reduce(Tensor::zeros({3}, DType::u8)), Error);
  EXPECT_THROW(comm.all_gather(Tensor::zeros({3}), Tensor::zeros({5})), Error);
}

}  // namespace
}  // namespace lockstep::comm
