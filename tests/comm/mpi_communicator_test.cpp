// The mpi backend, tested as real processes: each MpiCommunicator test launches this same
// test binary under mpirun, where the MpiWorker tests (skipped otherwise) run on every rank:
// the conformance suite every backend runs (comm/conformance.h), then what is MPI's own
// (messages, non-CPU tensors, a world made again, the watchdog, a program that initializes
// MPI itself).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/conformance.h"
#include "lockstep/core/tensor.h"

#ifdef LOCKSTEP_HAVE_MPI
#include <mpi.h>

#include "lockstep/comm/mpi/mpi_communicator.h"
#include "lockstep/comm/mpi/mpi_process.h"
#endif

namespace lockstep::comm {
namespace {

bool in_worker() { return std::getenv("LOCKSTEP_MPI_WORKER") != nullptr; }

// ---- the parent side: launch the workers, check their exit ----

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::string dirs = path;
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string candidate = dirs.substr(start, end - start) + "/" + program;
    if (end > start && access(candidate.c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

std::string self_path() {
  std::array<char, 4096> buffer{};
  const ssize_t n = readlink("/proc/self/exe", buffer.data(), buffer.size() - 1);
  return n > 0 ? std::string(buffer.data(), static_cast<size_t>(n)) : std::string();
}

struct Launch {
  int exit_code = -1;
  std::string output;
};

// Runs `np` copies of this binary under mpirun with the given gtest filter.
Launch launch_workers(int np, const std::string& filter) {
  char dir_template[] = "/tmp/lockstep-mpi-test-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  Launch launch;
  if (!dir) {
    launch.output = "mkdtemp failed";
    return launch;
  }
  // Under sanitizers: OpenMPI never frees what MPI_Init allocates, and takes its own internal
  // locks in orders TSan flags; neither is ours to fix, so the workers ignore those.
  const std::string suppressions = std::string(dir) + "/tsan.supp";
  std::ofstream(suppressions) << "deadlock:mca_btl_vader.so\ndeadlock:mca_btl_tcp.so\n";
  const std::string command =
      "env LOCKSTEP_MPI_WORKER=1 LOCKSTEP_COMM_TIMEOUT=120 LOCKSTEP_MPI_TEST_DIR=" + std::string(dir) +
      " ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0\" TSAN_OPTIONS=\"${TSAN_OPTIONS:+$TSAN_OPTIONS:}"
      "suppressions=" +
      suppressions +
      "\" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none"
      " OMPI_MCA_rmaps_base_oversubscribe=1 timeout 300 mpirun --oversubscribe --allow-run-as-root --bind-to none"
      " -np " +
      std::to_string(np) +
      " -x LOCKSTEP_MPI_WORKER -x LOCKSTEP_COMM_TIMEOUT -x LOCKSTEP_MPI_TEST_DIR -x ASAN_OPTIONS -x TSAN_OPTIONS " +
      self_path() + " --gtest_color=no '--gtest_filter=" + filter + "' 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) {
    launch.output = "popen failed: " + command;
    return launch;
  }
  std::array<char, 4096> buffer{};
  size_t n = 0;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) launch.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  launch.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::filesystem::remove_all(dir);
  return launch;
}

// The measured lines the workers print, for the person running the tests.
void print_timings(const std::string& output) {
  size_t start = 0;
  while (start < output.size()) {
    const size_t end = std::min(output.find('\n', start), output.size());
    const std::string line = output.substr(start, end - start);
    if (line.rfind("timing:", 0) == 0) std::printf("%s\n", line.c_str());
    start = end + 1;
  }
}

#ifdef LOCKSTEP_HAVE_MPI
constexpr bool kHaveMpi = true;
#else
constexpr bool kHaveMpi = false;
#endif

#define SKIP_UNLESS_MPIRUN()                                                                     \
  do {                                                                                           \
    if (in_worker()) GTEST_SKIP() << "this is a worker process";                                 \
    if (!kHaveMpi) GTEST_SKIP() << "built without MPI (install libopenmpi-dev and reconfigure)"; \
    if (!on_path("mpirun")) GTEST_SKIP() << "mpirun is not on PATH (install openmpi-bin)";       \
  } while (0)

void run_worker_suite(int np) {
  const Launch launch = launch_workers(np, "MpiWorker.*");
  ASSERT_EQ(launch.exit_code, 0) << "the MpiWorker tests failed on " << np << " ranks; their output:\n"
                                 << launch.output;
  // Every rank ran the suite to the end, and not skipped for want of the worker variable.
  size_t passed = 0;
  for (size_t at = launch.output.find("[  PASSED  ]"); at != std::string::npos;
       at = launch.output.find("[  PASSED  ]", at + 1)) {
    ++passed;
  }
  EXPECT_EQ(passed, static_cast<size_t>(np)) << launch.output;
  EXPECT_EQ(launch.output.find("runs under mpirun, launched by"), std::string::npos) << launch.output;
  print_timings(launch.output);
}

TEST(MpiCommunicator, WorkerSuiteOnOneRank) {
  SKIP_UNLESS_MPIRUN();
  run_worker_suite(1);
}

TEST(MpiCommunicator, WorkerSuiteOnThreeRanks) {
  SKIP_UNLESS_MPIRUN();
  run_worker_suite(3);
}

TEST(MpiCommunicator, WorkerSuiteOnFourRanks) {
  SKIP_UNLESS_MPIRUN();
  run_worker_suite(4);
}

TEST(MpiCommunicator, WatchdogAbortsTheJobWhenARankNeverArrives) {
  SKIP_UNLESS_MPIRUN();
  const Launch launch = launch_workers(2, "MpiWorkerTimeout.*");
  EXPECT_NE(launch.exit_code, 0) << launch.output;
  EXPECT_NE(launch.output.find("lockstep: rank 0: barrier #1 did not complete within 1 s; a rank may have died or "
                               "be stuck elsewhere; aborting the job"),
            std::string::npos)
      << launch.output;
  // The job ended by the abort, long before rank 1 woke from its sleep.
  EXPECT_EQ(launch.output.find("rank 1 woke up"), std::string::npos) << launch.output;
}

TEST(MpiCommunicator, ProgramThatInitializesMpiItselfWithSerializedThreads) {
  SKIP_UNLESS_MPIRUN();
  const Launch launch = launch_workers(2, "MpiWorkerUserInit.*");
  ASSERT_EQ(launch.exit_code, 0) << launch.output;
  EXPECT_NE(launch.output.find("[  PASSED  ] 1 test"), std::string::npos) << launch.output;
}

// ---- the worker side: runs on every rank under mpirun ----

#ifdef LOCKSTEP_HAVE_MPI

#define SKIP_UNLESS_WORKER() \
  if (!in_worker()) GTEST_SKIP() << "runs under mpirun, launched by the MpiCommunicator tests"

// Small integers: exact in every dtype, and so are their sums over four ranks.
double small_value(int rank, int64_t i) { return static_cast<double>((i * 7 + rank * 13) % 23 - 11); }

Tensor make(DType dtype, const std::vector<double>& values) {
  const auto count = static_cast<int64_t>(values.size());
  const Tensor out = Tensor::empty({count}, dtype);
  out.copy_from(Tensor::from_vector(values, {count}));
  return out;
}

::testing::AssertionResult holds(const Tensor& t, const std::vector<double>& expected) {
  const std::vector<double> got = t.to_vector<double>();
  if (got.size() != expected.size()) {
    return ::testing::AssertionFailure() << got.size() << " elements, want " << expected.size();
  }
  int64_t wrong = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double want = expected[i];
    if (got[i] != want) {
      if (wrong++ == 0) {
        first = "element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", want " + std::to_string(want);
      }
    }
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << wrong << " of " << got.size() << " elements wrong (" << dtype_name(t.dtype())
                                       << "); first: " << first;
}

std::vector<double> generate(int64_t count, const std::function<double(int64_t)>& value) {
  std::vector<double> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = value(i);
  return values;
}
Tensor make(DType dtype, int64_t count, const std::function<double(int64_t)>& value) {
  return make(dtype, generate(count, value));
}
::testing::AssertionResult holds(const Tensor& t, const std::function<double(int64_t)>& expected) {
  return holds(t, generate(t.numel(), expected));
}

double fold(int n, const std::function<double(int)>& of_rank, ReduceOp op) {
  double acc = of_rank(0);
  for (int r = 1; r < n; ++r) {
    const double v = of_rank(r);
    acc = op == ReduceOp::max ? std::max(acc, v) : op == ReduceOp::min ? std::min(acc, v) : acc + v;
  }
  return acc;
}

// The suite every backend runs (comm/conformance.h).
TEST(MpiWorker, Conformance) {
  SKIP_UNLESS_WORKER();
  auto world = MpiCommunicator::create_world();
  EXPECT_STREQ(world->backend(), "mpi");
  testing::run_conformance(*world);
}

TEST(MpiWorker, RecvNamesBothSizesAndDtypesOnAMismatch) {
  SKIP_UNLESS_WORKER();
  auto world = MpiCommunicator::create_world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  if (world->rank() == 0) {
    world->send(Tensor::zeros({10}), 1, 3);
  } else if (world->rank() == 1) {
    try {
      world->recv(Tensor::zeros({9}), 0, 3);
      ADD_FAILURE() << "a 9-element recv of a 10-element send succeeded";
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("rank 0 sent 10 f32 (40 bytes)"), std::string::npos) << message;
      EXPECT_NE(message.find("holds 9 f32 (36 bytes)"), std::string::npos) << message;
    }
    // The failed communicator refuses further use.
    EXPECT_THROW(world->recv(Tensor::zeros({4}), 0, 4), CommError);
  }
  auto fresh = MpiCommunicator::create_world();
  if (fresh->rank() == 0) {
    fresh->send(Tensor::zeros({4}), 1, 5);
  } else if (fresh->rank() == 1) {
    try {
      fresh->recv(Tensor::zeros({4}, DType::i32), 0, 5);
      ADD_FAILURE() << "an i32 recv of an f32 send succeeded";
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("sent 4 f32"), std::string::npos) << message;
      EXPECT_NE(message.find("holds 4 i32"), std::string::npos) << message;
    }
  }
}

TEST(MpiWorker, MismatchedCountsFailEveryRankNamingBoth) {
  SKIP_UNLESS_WORKER();
  auto world = MpiCommunicator::create_world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  const int me = world->rank();
  try {
    world->all_reduce(Tensor::zeros({4 + me}));
    ADD_FAILURE() << "all_reduce of different counts succeeded";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("rank 0 called all_reduce #1 (4 f32, sum)"), std::string::npos) << message;
    EXPECT_NE(message.find("rank 1 called all_reduce #1 (5 f32, sum)"), std::string::npos) << message;
  }
  EXPECT_THROW(world->barrier(), CommError);  // the communicator is done for
}

TEST(MpiWorker, WorldCanBeCreatedAgainAfterDestruction) {
  SKIP_UNLESS_WORKER();
  for (int round = 0; round < 3; ++round) {
    auto world = MpiCommunicator::create_world();
    const Tensor t = Tensor::full({5}, round + 1, DType::i32);
    world->all_reduce(t);
    EXPECT_TRUE(holds(t, [&](int64_t) { return (round + 1) * world->size(); }));
  }
  int provided = 0;
  MPI_Query_thread(&provided);
  if (MpiCommunicator::create_world()->rank() == 0) {
    std::printf("timing: MPI thread level %s\n",
                provided == MPI_THREAD_MULTIPLE ? "MPI_THREAD_MULTIPLE" : "below MULTIPLE");
  }
}

// Not a check: how much the deterministic all_reduce costs next to MPI's own MPI_Allreduce
// (whose order we do not control). Printed by rank 0; the parent test shows the lines.
TEST(MpiWorker, TimingAgainstMpiAllreduce) {
  SKIP_UNLESS_WORKER();
  auto world = MpiCommunicator::create_world();
  if (world->size() == 1) return;
  using Clock = std::chrono::steady_clock;
  // LOCKSTEP_MPI_TIMING=full: larger sizes and more repetitions, for a run by hand.
  const bool full = std::getenv("LOCKSTEP_MPI_TIMING") && std::string(std::getenv("LOCKSTEP_MPI_TIMING")) == "full";
  std::vector<int64_t> counts = {int64_t{1} << 10, int64_t{1} << 16, int64_t{1} << 20};
  if (full) counts.insert(counts.end(), {int64_t{1} << 22, int64_t{1} << 24});
  for (int64_t count : counts) {
    const int reps = full ? (count >= (int64_t{1} << 22) ? 15 : 51) : (count >= (int64_t{1} << 20) ? 3 : 11);
    const Tensor t = Tensor::zeros({count});
    float* data = t.data<float>();
    auto time_ms = [&](const std::function<void()>& body) {
      MPI_Barrier(MPI_COMM_WORLD);  // start together
      const auto start = Clock::now();
      body();
      return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    };
    auto mpi_allreduce = [&] {
      MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    };
    world->all_reduce(t);  // warm up both paths
    mpi_allreduce();
    // Alternating, so a change in the machine's load hits both alike; medians.
    std::vector<double> ours, theirs;
    for (int k = 0; k < reps; ++k) {
      ours.push_back(time_ms([&] { world->all_reduce(t); }));
      theirs.push_back(time_ms(mpi_allreduce));
    }
    std::sort(ours.begin(), ours.end());
    std::sort(theirs.begin(), theirs.end());
    const double ours_ms = ours[ours.size() / 2];
    const double theirs_ms = theirs[theirs.size() / 2];
    if (world->rank() == 0) {
      std::printf(
          "timing: np=%d f32 count=%lld (%lld KiB): deterministic all_reduce %.3f ms, MPI_Allreduce %.3f ms "
          "(medians of %d)\n",
          world->size(), static_cast<long long>(count), static_cast<long long>(count * 4 / 1024), ours_ms, theirs_ms,
          reps);
    }
  }
}

// Launched alone by WatchdogAbortsTheJobWhenARankNeverArrives: rank 1 never calls the barrier.
TEST(MpiWorkerTimeout, RankThatNeverArrives) {
  SKIP_UNLESS_WORKER();
  auto world = MpiCommunicator::create_world();
  world->set_timeout(std::chrono::seconds(1));
  if (world->rank() == 0) {
    world->barrier();
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(30));
    std::printf("rank 1 woke up\n");
  }
}

// Launched alone: the program owns MPI (initializes and finalizes it) and grants only
// MPI_THREAD_SERIALIZED, so the backend serializes every MPI call of the process.
TEST(MpiWorkerUserInit, SerializedAndOwnedByTheProgram) {
  SKIP_UNLESS_WORKER();
  int provided = 0;
  ASSERT_EQ(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), MPI_SUCCESS);
  {
    auto world = MpiCommunicator::create_world();
    EXPECT_EQ(MpiProcess::get().serialized(), provided < MPI_THREAD_MULTIPLE);
    const int n = world->size();
    const int me = world->rank();
    auto alone = world->split(me, 0);  // a group of one per rank
    ASSERT_NE(alone, nullptr);
    EXPECT_EQ(alone->size(), 1);
    // world's worker thread and this thread call MPI at the same time, through the lock.
    std::vector<Tensor> tensors;
    std::vector<Work> works;
    for (int k = 0; k < 20; ++k) {
      tensors.push_back(make(DType::f32, 10000, [&](int64_t i) { return small_value(me, i + k); }));
      works.push_back(world->all_reduce_async(tensors.back()));
      const Tensor own = Tensor::full({100}, k, DType::i32);
      alone->all_reduce(own);
      EXPECT_TRUE(holds(own, [&](int64_t) { return k; }));
    }
    for (const Work& work : works) work.wait();
    for (int k = 0; k < 20; ++k) {
      EXPECT_TRUE(holds(tensors[static_cast<size_t>(k)], [&](int64_t i) {
        return fold(
            n, [&](int r) { return small_value(r, i + k); }, ReduceOp::sum);
      }));
    }
  }
  // The backend did not initialize MPI, so it leaves finalizing to the program.
  int finalized = 1;
  MPI_Finalized(&finalized);
  EXPECT_EQ(finalized, 0);
  MPI_Finalize();
  EXPECT_THROW(MpiCommunicator::create_world(), Error);
}

#endif  // LOCKSTEP_HAVE_MPI

}  // namespace
}  // namespace lockstep::comm
