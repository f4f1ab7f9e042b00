// Sparkline blocks for percentages and the per-device history the full view draws.
#include "tools/top/top_history.h"

#include <gtest/gtest.h>

#include "tools/top/top_testing.h"

namespace lockstep::tools {
namespace {

TEST(TopSparkline, MapsZeroToTheLowestBlockAndHundredToTheFullOne) {
  EXPECT_EQ(spark_block(0.0), "▁");
  EXPECT_EQ(spark_block(100.0), "█");
  // Eight blocks for 0..100: block k covers values nearest k * 100/7.
  EXPECT_EQ(spark_block(100.0 / 7), "▂");
  EXPECT_EQ(spark_block(7.0), "▁");   // 0.49 of a step rounds down
  EXPECT_EQ(spark_block(7.2), "▂");   // 0.504 of a step rounds up
  EXPECT_EQ(spark_block(50.0), "▅");  // 3.5 steps rounds up to the fifth block
  EXPECT_EQ(spark_block(85.0), "▇");  // 5.95 steps
  EXPECT_EQ(spark_block(-5.0), "▁");
  EXPECT_EQ(spark_block(250.0), "█");
  EXPECT_EQ(spark_block(std::nullopt), " ");
}

TEST(TopSparkline, KeepsTheNewestValueAtTheRightEdge) {
  const std::deque<std::optional<double>> values = {0.0, 100.0, std::nullopt, 50.0};
  EXPECT_EQ(sparkline(values, 6), "  ▁█ ▅");
  EXPECT_EQ(sparkline(values, 2), " ▅");
  EXPECT_EQ(sparkline({}, 3), "   ");
}

TEST(TopHistory, RecordsEachGpusUtilizationAndMemoryUpToItsCapacity) {
  History history(3);
  TopSample sample = top_testing::two_gpu_sample();
  for (unsigned u : {10u, 20u, 30u, 40u}) {
    sample.gpus.devices[1].utilization_gpu = u;
    history.add(sample);
  }
  const History::Series& gpu1 = history.of("gpu1");
  ASSERT_EQ(gpu1.utilization.size(), 3u);
  EXPECT_EQ(gpu1.utilization.front(), 20.0);
  EXPECT_EQ(gpu1.utilization.back(), 40.0);
  EXPECT_DOUBLE_EQ(*gpu1.memory.back(), 100.0 * 70000 / 81920);
  EXPECT_TRUE(history.of("gpu7").utilization.empty());
}

TEST(TopHistory, RecordsCoresAndHostMemoryOnTheCpuView) {
  History history;
  history.add(top_testing::cpu_sample());
  EXPECT_EQ(history.of("cpu1").utilization.back(), 100.0);
  EXPECT_DOUBLE_EQ(*history.of("memory").memory.back(), 75.0);  // 12288 of 16384 MiB
}

}  // namespace
}  // namespace lockstep::tools
