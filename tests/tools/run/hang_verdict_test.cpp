// The launcher's verdict from its ranks' flight records: who holds the others back, where,
// and for how long, in one line.
#include "tools/run/hang_verdict.h"

#include <gtest/gtest.h>

namespace lockstep::tools {
namespace {

using comm::CallState;
using comm::FlightCall;
using comm::FlightReport;

constexpr int64_t kNow = 1'800'000'000'000;

// A rank of a 4-rank job in `phase` of `step`, that has issued `issued` collectives on the
// world and finished `done`; a waiting all_reduce when issued > done, for `waiting_s`.
FlightReport rank_report(int rank, const std::string& phase, int64_t step, uint64_t issued, uint64_t done,
                         int64_t waiting_s = 31) {
  FlightReport r;
  r.rank = rank;
  r.pid = 1000 + rank;
  r.reason = "running";
  r.written_ms = kNow;
  r.last_progress_ms = kNow - waiting_s * 1000;
  r.activity = {.step = step, .micro_batch = 2, .phase = phase, .since_ms = kNow - waiting_s * 1000};
  r.groups = {{.name = "world", .rank = rank, .size = 4, .issued = issued, .done = done}};
  for (uint64_t s = std::max<uint64_t>(1, done); s <= issued; ++s) {
    FlightCall call{.id = s,
                    .group = "world",
                    .group_rank = rank,
                    .group_size = 4,
                    .call = "all_reduce",
                    .sequence = s,
                    .count = 1000,
                    .dtype = "f32",
                    .op = "sum",
                    .state = s <= done ? CallState::done : CallState::waiting,
                    .issued_ms = kNow - waiting_s * 1000,
                    .started_ms = kNow - waiting_s * 1000,
                    .ended_ms = s <= done ? kNow - waiting_s * 1000 : 0};
    r.calls.push_back(call);
  }
  return r;
}

TEST(HangVerdict, NamesTheRankThatHoldsTheOthersBack) {
  std::vector<std::optional<FlightReport>> reports = {
      rank_report(0, "step", 812, 4411, 4410), rank_report(1, "backward", 812, 4410, 4410),
      rank_report(2, "step", 812, 4411, 4410), rank_report(3, "step", 812, 4411, 4410)};
  EXPECT_EQ(hang_verdict(reports, -1, "", kNow),
            "rank 1 holds the others back: it is in backward of step 812, micro-batch 2, for 31 s; ranks 0, 2, 3 "
            "wait in all_reduce #4411 on world (1000 f32, sum) for 31 s");
}

TEST(HangVerdict, AFailedRankComesFirstWithWhereItWas) {
  std::vector<std::optional<FlightReport>> reports = {rank_report(0, "step", 5, 9, 8, 2),
                                                      rank_report(1, "backward", 5, 8, 8, 2),
                                                      rank_report(2, "step", 5, 9, 8, 2), std::nullopt};
  EXPECT_EQ(hang_verdict(reports, 1, "killed by signal 9 (Killed)", kNow),
            "rank 1 failed (killed by signal 9 (Killed)) in backward of step 5, micro-batch 2; ranks 0, 2 wait in "
            "all_reduce #9 on world (1000 f32, sum) for 2.0 s; rank 3 left no flight record");
}

TEST(HangVerdict, RanksThatAllWaitInOneCollectiveAreOneClause) {
  std::vector<std::optional<FlightReport>> reports;
  for (int r = 0; r < 8; ++r) reports.push_back(rank_report(r, "step", 3, 7, 6, 40));
  reports[5] = rank_report(5, "data loading", 3, 6, 6, 40);
  reports[6] = rank_report(6, "data loading", 3, 6, 6, 40);
  EXPECT_EQ(hang_verdict(reports, -1, "", kNow),
            "ranks 5, 6 hold the others back: they are in data loading of step 3, micro-batch 2, for 40 s; "
            "ranks 0-4, 7 wait in all_reduce #7 on world (1000 f32, sum) for 40 s");
}

TEST(HangVerdict, ACallThatFailedUnderARankIsWhereItWaited) {
  FlightReport waiter = rank_report(0, "step", 2, 3, 2, 5);
  waiter.calls.back().state = CallState::failed;
  waiter.calls.back().ended_ms = kNow - 1000;
  waiter.calls.back().error = "rank 1 died";
  std::vector<std::optional<FlightReport>> reports = {waiter, rank_report(1, "forward", 2, 2, 2, 5)};
  EXPECT_EQ(hang_verdict(reports, -1, "", kNow),
            "rank 1 holds the others back: it is in forward of step 2, micro-batch 2, for 5.0 s; rank 0 waited in "
            "all_reduce #3 on world (1000 f32, sum) for 4.0 s until it failed");
}

TEST(HangVerdict, RanksThatAreNotBehindAreSaidToBeWhereTheyAre) {
  std::vector<std::optional<FlightReport>> reports = {rank_report(0, "evaluation", 10, 4, 4, 3),
                                                      rank_report(1, "evaluation", 10, 4, 4, 3)};
  EXPECT_EQ(hang_verdict(reports, -1, "", kNow), "ranks 0, 1 are in evaluation of step 10, micro-batch 2, for 3.0 s");
}

TEST(HangVerdict, ARankWhoseRecordAgesIsStoppedOrFrozen) {
  FlightReport stopped = rank_report(1, "backward", 7, 20, 20, 6);
  stopped.written_ms = kNow - 5000;  // its writer has not run since
  FlightReport ended = rank_report(2, "step boundary", 7, 20, 20, 6);
  ended.reason = "exit";
  std::vector<std::optional<FlightReport>> reports = {rank_report(0, "step", 7, 21, 20, 6), stopped, ended};
  EXPECT_EQ(hang_verdict(reports, -1, "", kNow),
            "rank 1 has not written a record for 5.0 s (stopped or frozen): it was in backward of step 7, "
            "micro-batch 2; rank 0 waits in all_reduce #21 on world (1000 f32, sum) for 6.0 s; rank 2 exited after "
            "step boundary of step 7, micro-batch 2");
}

TEST(HangVerdict, NothingToSayWithoutRecords) {
  EXPECT_EQ(hang_verdict({std::nullopt, std::nullopt}, 1, "exit code 3", kNow), "");
  EXPECT_EQ(newest_progress_ms({std::nullopt, rank_report(1, "step", 1, 1, 1, 7)}), kNow - 7000);
}

}  // namespace
}  // namespace lockstep::tools
