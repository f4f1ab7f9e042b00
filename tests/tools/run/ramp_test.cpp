// The ramp's pure parts (tools/run/ramp.h): its scales, the figure found in a program's
// output, lockstep train's figures and --out, the table's speed-up and efficiency against the
// first scale, and the first scale whose weights differ.
#include "tools/run/ramp.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "lockstep/core/error.h"

namespace lockstep::tools {
namespace {

namespace fs = std::filesystem;

TEST(Ramp, ScalesArePositiveAndRising) {
  EXPECT_EQ(parse_ramp("1,2,4"), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(parse_ramp("3"), (std::vector<int>{3}));
  for (const char* bad : {"", "0,2", "2,1", "1,1", "1,,2", "1,2,", "one", "1.5", "-1", "2x"}) {
    EXPECT_THROW(parse_ramp(bad), UsageError) << bad;
  }
}

TEST(Ramp, EachScaleTakesTheFirstGpusOfTheList) {
  EXPECT_EQ(ramp_gpus("0,2,3,5", 1, 4), "0");
  EXPECT_EQ(ramp_gpus("0,2,3,5", 2, 4), "0,2");
  EXPECT_EQ(ramp_gpus("0,2,3,5", 4, 4), "0,2,3,5");
  EXPECT_EQ(ramp_gpus("auto", 2, 4), "auto");
  EXPECT_EQ(ramp_gpus("", 2, 4), "");
  EXPECT_THROW(ramp_gpus("0,1", 1, 4), UsageError);
}

TEST(Ramp, TheMetricIsTheMeanOfTheMatchesAfterTheFirst) {
  const std::string pattern = "samples/s=([0-9.]+)";
  EXPECT_DOUBLE_EQ(*metric_in_output("a samples/s=10\nb samples/s=30\nc samples/s=50\n", pattern), 40.0);
  EXPECT_DOUBLE_EQ(*metric_in_output("only samples/s=12.5\n", pattern), 12.5);
  EXPECT_FALSE(metric_in_output("nothing here\n", pattern));
  EXPECT_THROW(metric_in_output("", "samples/s=[0-9]+"), UsageError);  // no group
  EXPECT_THROW(metric_in_output("", "(a)(b)"), UsageError);            // two
  EXPECT_THROW(metric_in_output("", "([0-9"), UsageError);             // not a regex
}

TEST(Ramp, LockstepTrainIsKnownByItsNameOrThisProgram) {
  EXPECT_TRUE(is_lockstep_train({"lockstep", "train", "--steps", "5"}, ""));
  EXPECT_TRUE(is_lockstep_train({"/opt/bin/lockstep", "train"}, ""));
  EXPECT_FALSE(is_lockstep_train({"lockstep", "bench"}, ""));
  EXPECT_FALSE(is_lockstep_train({"python3", "train"}, ""));
  EXPECT_TRUE(is_lockstep_train({"/bin/sh", "train"}, "/bin/sh"));
}

TEST(Ramp, EachScaleOfLockstepTrainGetsItsOwnOut) {
  const std::vector<std::string> plain = {"lockstep", "train", "--steps", "5"};
  EXPECT_EQ(out_dir_of(plain), "");
  EXPECT_EQ(with_out_dir(plain, "/r/w2"),
            (std::vector<std::string>{"lockstep", "train", "--out", "/r/w2", "--steps", "5"}));
  const std::vector<std::string> spaced = {"lockstep", "train", "--out", "runs/a", "--steps", "5"};
  EXPECT_EQ(out_dir_of(spaced), "runs/a");
  EXPECT_EQ(with_out_dir(spaced, "runs/a/w2")[3], "runs/a/w2");
  const std::vector<std::string> joined = {"lockstep", "train", "--out=runs/b"};
  EXPECT_EQ(out_dir_of(joined), "runs/b");
  EXPECT_EQ(with_out_dir(joined, "x"), (std::vector<std::string>{"lockstep", "train", "--out=x"}));
}

TEST(Ramp, TrainFiguresComeFromTheSummaryElseTheStepLog) {
  const fs::path dir = fs::temp_directory_path() / ("lockstep-ramp-test-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  RampScale none;
  read_train_figures(dir.string(), none);
  EXPECT_FALSE(none.throughput);
  std::ofstream(dir / "metrics.jsonl") << R"({"step":1,"samples_per_second":100})"
                                       << "\n"
                                       << R"({"step":2,"samples_per_second":300})"
                                       << "\n"
                                       << R"({"step":3,"samples_per_second":500})"
                                       << "\n";
  RampScale stopped;
  read_train_figures(dir.string(), stopped);
  EXPECT_DOUBLE_EQ(*stopped.throughput, 400.0);
  EXPECT_FALSE(stopped.steps);
  EXPECT_EQ(stopped.source, "metrics.jsonl samples_per_second");
  std::ofstream(dir / "summary.json") << R"({"samples_per_second":250.5,"steps":3,"weights_sha256":"ab12"})";
  RampScale whole;
  read_train_figures(dir.string(), whole);
  EXPECT_DOUBLE_EQ(*whole.throughput, 250.5);
  EXPECT_EQ(whole.steps, 3);
  EXPECT_EQ(whole.weights_sha256, "ab12");
  fs::remove_all(dir);
}

RampScale scale(int workers, std::optional<double> throughput, int64_t steps = 0, const std::string& sha = "") {
  RampScale s;
  s.workers = workers;
  s.throughput = throughput;
  s.source = "test";
  if (!sha.empty()) {
    s.steps = steps;
    s.weights_sha256 = sha;
  }
  return s;
}

TEST(Ramp, TheTableSetsEachScaleAgainstTheFirst) {
  const std::string table = ramp_table({scale(1, 100), scale(2, 190), scale(4, 300), scale(8, std::nullopt)});
  // speed-up = throughput / the first's; efficiency = speed-up / (workers / the first's workers).
  EXPECT_NE(table.find("      2       190.0     1.90x         95%  test"), std::string::npos) << table;
  EXPECT_NE(table.find("      4       300.0     3.00x         75%  test"), std::string::npos) << table;
  EXPECT_NE(table.find("      8           -         -           -  test"), std::string::npos) << table;
  // A ramp that starts at 2 workers: 4 workers at twice the throughput is 100%.
  EXPECT_NE(ramp_table({scale(2, 50), scale(4, 100)}).find("2.00x        100%"), std::string::npos);
  // No figure at the first scale: no speed-ups at all.
  EXPECT_NE(ramp_table({scale(1, std::nullopt), scale(2, 80)}).find("      2        80.0         -           -"),
            std::string::npos);
}

TEST(Ramp, TheFirstScaleWithOtherWeightsIsNamed) {
  const std::vector<RampScale> agree = {scale(1, 10, 30, "aaaa"), scale(2, 20, 30, "aaaa"), scale(4, 40, 30, "aaaa")};
  EXPECT_EQ(first_scale_with_other_weights(agree), -1);
  EXPECT_NE(ramp_table(agree).find("weights: 1, 2, 4 workers end 30 steps with the same weights_sha256 aaaa"),
            std::string::npos)
      << ramp_table(agree);
  const std::vector<RampScale> differ = {scale(1, 10, 30, "aaaa"), scale(2, 20, 30, "aaaa"), scale(4, 40, 30, "bbbb"),
                                         scale(8, 80, 30, "cccc")};
  EXPECT_EQ(first_scale_with_other_weights(differ), 2);
  EXPECT_NE(ramp_table(differ).find("weights: 4 workers end with other weights than 1 (bbbb against aaaa)"),
            std::string::npos)
      << ramp_table(differ);
  // A scale stopped after fewer steps is not compared.
  EXPECT_EQ(first_scale_with_other_weights({scale(1, 10, 30, "aaaa"), scale(2, 20, 12, "bbbb")}), -1);
}

}  // namespace
}  // namespace lockstep::tools
