// The flight recorder: every communicator call recorded as issued, waiting and ended (or
// failed, with its error), the loop's step and phase, the file format read back, and the
// files a rank process writes (while it runs, and on SIGUSR2 without a folder).
#include "lockstep/comm/flight_recorder.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "comm/process_launcher.h"
#include "lockstep/comm/init.h"
#include "lockstep/comm/local_communicator.h"

namespace lockstep::comm {
namespace {

namespace fs = std::filesystem;

// The calls recorded after `after` (an id), by this process's recorder.
std::vector<FlightCall> calls_after(uint64_t after) {
  std::vector<FlightCall> calls;
  for (const FlightCall& call : FlightRecorder::process().report("test").calls) {
    if (call.id > after) calls.push_back(call);
  }
  return calls;
}

uint64_t last_id() {
  const FlightReport report = FlightRecorder::process().report("test");
  return report.calls.empty() ? 0 : report.calls.back().id;
}

TEST(FlightRecorder, RecordsEveryCallWithItsArgumentsAndHowItEnded) {
  const uint64_t before = last_id();
  auto group = LocalCommunicator::create_group(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      Communicator& comm = *group[static_cast<size_t>(r)];
      Tensor x = Tensor::full({5}, 1.0, DType::f32);
      comm.all_reduce(x, ReduceOp::avg);
      comm.broadcast(x, 1);
      if (r == 0) comm.send(x, 1, 7);
      if (r == 1) comm.recv(x, 0, 7);
    });
  }
  for (auto& t : threads) t.join();
  const std::vector<FlightCall> calls = calls_after(before);
  ASSERT_EQ(calls.size(), 6u);
  int all_reduces = 0, sends = 0;
  for (const FlightCall& call : calls) {
    EXPECT_EQ(call.state, CallState::done) << describe_call(call);
    EXPECT_EQ(call.group, "world");
    EXPECT_EQ(call.group_size, 2);
    EXPECT_GT(call.issued_ms, 0);
    EXPECT_GE(call.started_ms, call.issued_ms);
    EXPECT_GE(call.ended_ms, call.started_ms);
    if (call.call == "all_reduce") {
      ++all_reduces;
      EXPECT_EQ(call.sequence, 1u);
      EXPECT_EQ(describe_call(call), "all_reduce #1 on world (5 f32, avg)");
    }
    if (call.call == "broadcast") {
      EXPECT_EQ(describe_call(call), "broadcast #2 on world (5 f32, root 1)");
    }
    if (call.call == "send") {
      ++sends;
      EXPECT_EQ(describe_call(call), "send to rank 1 on world (5 f32, tag 7)");
    }
    if (call.call == "recv") {
      EXPECT_EQ(describe_call(call), "recv from rank 0 on world (5 f32, tag 7)");
    }
  }
  EXPECT_EQ(all_reduces, 2);
  EXPECT_EQ(sends, 1);
}

TEST(FlightRecorder, ASplitGroupHasANameOfItsOwn) {
  const uint64_t before = last_id();
  auto group = LocalCommunicator::create_group(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::shared_ptr<Communicator> half = group[static_cast<size_t>(r)]->split(r, 0);
      EXPECT_EQ(half->group_name(), "world/split1/color" + std::to_string(r));
      half->barrier();
    });
  }
  for (auto& t : threads) t.join();
  int barriers = 0;
  for (const FlightCall& call : calls_after(before)) {
    if (call.call != "barrier") continue;
    ++barriers;
    EXPECT_EQ(call.group.rfind("world/split1/color", 0), 0u) << call.group;
    EXPECT_EQ(describe_call(call), "barrier #1 on " + call.group);
  }
  EXPECT_EQ(barriers, 2);
}

TEST(FlightRecorder, AFailedCallKeepsItsError) {
  const uint64_t before = last_id();
  auto group = LocalCommunicator::create_group(2);
  group[0]->set_timeout(std::chrono::milliseconds(100));
  Tensor x = Tensor::zeros({3}, DType::f32);
  EXPECT_THROW(group[0]->all_reduce(x), CommError);  // rank 1 never comes
  const std::vector<FlightCall> calls = calls_after(before);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].state, CallState::failed);
  EXPECT_FALSE(calls[0].error.empty());
  const FlightReport report = FlightRecorder::process().report("test");
  EXPECT_FALSE(report.failure.empty());
  group[1]->abort("the test is over");
}

TEST(FlightRecorder, KnowsTheStepMicroBatchAndPhase) {
  FlightRecorder& recorder = FlightRecorder::process();
  recorder.set_step(812);
  recorder.set_micro_batch(2);
  {
    const FlightPhase outer("step");
    {
      const FlightPhase inner("backward");
      EXPECT_EQ(describe_activity(recorder.report("test").activity), "backward of step 812, micro-batch 2");
    }
    EXPECT_EQ(recorder.report("test").activity.phase, "step");
  }
  recorder.set_step(813);  // a new step forgets the last micro-batch
  {
    const FlightPhase phase("step");  // the step's own phase is the step
    EXPECT_EQ(describe_activity(recorder.report("test").activity), "step 813");
    recorder.set_micro_batch(0);
    EXPECT_EQ(describe_activity(recorder.report("test").activity), "step 813, micro-batch 0");
  }
}

TEST(FlightRecorder, ItsFileFormatReadsBack) {
  FlightReport report;
  report.rank = 3;
  report.pid = 4242;
  report.reason = "failure";
  report.written_ms = 1700000000123;
  report.last_progress_ms = 1700000000000;
  report.activity = {.step = 9, .micro_batch = 1, .phase = "forward", .since_ms = 1699999999000};
  report.failure = "rank 2 died \xff";  // any bytes an error may hold
  report.groups = {{.name = "world", .rank = 3, .size = 4, .issued = 12, .done = 11}};
  report.calls = {{.id = 5,
                   .group = "world",
                   .group_rank = 3,
                   .group_size = 4,
                   .call = "all_gather",
                   .sequence = 12,
                   .count = 64,
                   .dtype = "bf16",
                   .state = CallState::waiting,
                   .issued_ms = 1,
                   .started_ms = 2}};
  const FlightReport back = parse_flight_report(flight_report_json(report));
  EXPECT_EQ(back.rank, 3);
  EXPECT_EQ(back.pid, 4242);
  EXPECT_EQ(back.reason, "failure");
  EXPECT_EQ(back.written_ms, report.written_ms);
  EXPECT_EQ(back.last_progress_ms, report.last_progress_ms);
  EXPECT_EQ(describe_activity(back.activity), "forward of step 9, micro-batch 1");
  EXPECT_EQ(back.activity.since_ms, report.activity.since_ms);
  EXPECT_EQ(back.failure.rfind("rank 2 died ", 0), 0u);
  ASSERT_EQ(back.groups.size(), 1u);
  EXPECT_EQ(back.groups[0].issued, 12u);
  EXPECT_EQ(back.groups[0].done, 11u);
  ASSERT_EQ(back.calls.size(), 1u);
  EXPECT_EQ(back.calls[0].state, CallState::waiting);
  EXPECT_EQ(describe_call(back.calls[0]), "all_gather #12 on world (64 bf16)");
  EXPECT_EQ(back.calls[0].started_ms, 2);
}

TEST(FlightRecorder, ABadFileIsAnErrorThatSaysSo) {
  for (const std::string text : {"", "{}", "{\"format\": \"lockstep-flight-1\"}", "[1, 2"}) {
    try {
      parse_flight_report(text);
      ADD_FAILURE() << "accepted '" << text << "'";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_TRUE(what.find("flight record") != std::string::npos) << what;
    }
  }
}

// ---- a rank process's files ----

bool worker(const char* mode) { return testing::worker_mode() && std::strcmp(testing::worker_mode(), mode) == 0; }

TEST(FlightWorker, WritesItsRecordWhileItRuns) {
  if (!worker("flight-file")) GTEST_SKIP() << "runs only as a rank launched by FlightRecorder tests";
  std::shared_ptr<Communicator> comm = init_process_group("shm");
  FlightRecorder::process().set_step(4);
  const FlightPhase phase("optimizer");
  Tensor x = Tensor::full({10}, 1.0, DType::f32);
  comm->all_reduce(x);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // longer than the writer's interval
  comm->barrier();
}

TEST(FlightWorker, PrintsItsRecordOnSigusr2) {
  if (!worker("flight-signal")) GTEST_SKIP() << "runs only as a rank launched by FlightRecorder tests";
  std::shared_ptr<Communicator> comm = init_process_group("shm");
  FlightRecorder::process().set_step(6);
  const FlightPhase phase("forward");
  kill(getpid(), SIGUSR2);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  comm->barrier();
}

TEST(FlightRecorder, EachRankWritesItsFileWhileItRuns) {
  const fs::path dir = fs::temp_directory_path() / ("lockstep-flight-test-" + std::to_string(getpid()));
  fs::remove_all(dir);
  const auto exits = testing::launch_ranks(2, "FlightWorker.WritesItsRecordWhileItRuns",
                                           {{"LOCKSTEP_TEST_WORKER", "flight-file"}, {"LOCKSTEP_FLIGHT_DIR", dir}});
  for (const auto& e : exits) ASSERT_EQ(e.exit_code, 0) << testing::describe(exits);
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(dir / ("rank" + std::to_string(r) + ".flight.json"));
    ASSERT_TRUE(in) << "rank " << r << " wrote no record in " << dir;
    const FlightReport report =
        parse_flight_report({std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()});
    EXPECT_EQ(report.rank, r);
    EXPECT_EQ(report.reason, "exit");  // the last write, at exit
    EXPECT_EQ(report.activity.step, 4);
    bool reduced = false;
    for (const FlightCall& call : report.calls) reduced |= call.call == "all_reduce" && call.state == CallState::done;
    EXPECT_TRUE(reduced) << flight_report_json(report);
    ASSERT_EQ(report.groups.size(), 1u);
    EXPECT_EQ(report.groups[0].name, "world");
    EXPECT_EQ(report.groups[0].issued, report.groups[0].done);
  }
  fs::remove_all(dir);
}

TEST(FlightRecorder, WithoutAFolderSigusr2PrintsTheRecord) {
  const auto exits = testing::launch_ranks(2, "FlightWorker.PrintsItsRecordOnSigusr2",
                                           {{"LOCKSTEP_TEST_WORKER", "flight-signal"}, {"LOCKSTEP_FLIGHT_DIR", ""}});
  for (const auto& e : exits) {
    ASSERT_EQ(e.exit_code, 0) << testing::describe(exits);
    EXPECT_NE(e.output.find("lockstep flight record (SIGUSR2): rank "), std::string::npos) << e.output;
    EXPECT_NE(e.output.find("forward of step 6"), std::string::npos) << e.output;
  }
}

}  // namespace
}  // namespace lockstep::comm
