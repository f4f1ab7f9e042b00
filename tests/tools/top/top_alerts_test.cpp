// Each alert rule on both sides of its threshold.
#include "tools/top/top_alerts.h"

#include <gtest/gtest.h>

#include "tools/top/top_testing.h"

namespace lockstep::tools {
namespace {

using top_testing::a100;
using top_testing::process;

std::vector<std::string> kinds(const std::vector<Alert>& alerts) {
  std::vector<std::string> out;
  for (const Alert& a : alerts) out.push_back(a.kind);
  return out;
}

gpu::GpuState one_job(unsigned low, unsigned high) {
  gpu::GpuState state;
  state.devices = {a100(0, high, 1000), a100(1, low, 1000), a100(2, 0, 0)};
  state.devices[0].processes = {process(10, "alice", "python train.py --lr 0.1", 900)};
  state.devices[1].processes = {process(11, "alice", "python train.py --lr 0.1", 900)};
  return state;
}

TEST(TopAlerts, MemoryAlertsAboveNinetyFivePercentOnly) {
  gpu::GpuState state;
  state.devices = {a100(0, 50, 0), a100(1, 50, 0)};
  state.devices[0].memory_used = state.devices[0].memory_total / 100 * 95;  // exactly 95%: no alert
  state.devices[1].memory_used = state.devices[1].memory_total / 1000 * 951;
  const auto alerts = find_alerts(state);
  ASSERT_EQ(kinds(alerts), std::vector<std::string>{"memory"});
  EXPECT_EQ(alerts[0].devices, std::vector<unsigned>{1});
  EXPECT_NE(alerts[0].message.find("GPU 1 memory 95.1%"), std::string::npos) << alerts[0].message;
}

TEST(TopAlerts, LoadImbalanceWithinOneJobAtThirtyPoints) {
  EXPECT_TRUE(find_alerts(one_job(20, 49)).empty());  // 29 points apart
  const auto alerts = find_alerts(one_job(20, 50));
  ASSERT_EQ(kinds(alerts), std::vector<std::string>{"imbalance"});
  EXPECT_EQ(alerts[0].devices, (std::vector<unsigned>{0, 1}));  // GPU 2 (idle, no process) is not in the job
  EXPECT_NE(alerts[0].message.find("GPU 1 is at 20% and GPU 0 at 50%"), std::string::npos) << alerts[0].message;
  EXPECT_NE(alerts[0].message.find("alice: python train.py --lr 0.1"), std::string::npos) << alerts[0].message;
}

TEST(TopAlerts, DifferentJobsOrUnknownProcessesAreNotOneJob) {
  gpu::GpuState state = one_job(0, 100);
  state.devices[1].processes[0].command = "python eval.py";
  EXPECT_TRUE(find_alerts(state).empty());
  state = one_job(0, 100);
  state.devices[1].processes[0].user = "bob";
  EXPECT_TRUE(find_alerts(state).empty());
  // From another PID namespace: no command to match on, whatever the empty strings say.
  state = one_job(0, 100);
  for (gpu::GpuDevice& d : state.devices)
    for (gpu::GpuProcess& p : d.processes) p.in_this_namespace = false;
  EXPECT_TRUE(find_alerts(state).empty());
}

TEST(TopAlerts, ThermalAndPowerThrottlingAlertButIdleDoesNot) {
  gpu::GpuState state;
  state.devices = {a100(0, 0, 0), a100(1, 90, 0), a100(2, 90, 0), a100(3, 90, 0)};
  state.devices[0].throttle_reasons = gpu::kThrottleGpuIdle;
  state.devices[1].throttle_reasons = gpu::kThrottleHwThermalSlowdown;
  state.devices[2].throttle_reasons = gpu::kThrottleSwPowerCap;
  state.devices[3].throttle_reasons = gpu::kThrottleSwThermalSlowdown | gpu::kThrottleHwPowerBrakeSlowdown;
  const auto alerts = find_alerts(state);
  ASSERT_EQ(kinds(alerts), (std::vector<std::string>{"thermal", "power", "thermal", "power"}));
  EXPECT_EQ(alerts[0].devices, std::vector<unsigned>{1});
  EXPECT_NE(alerts[0].message.find("64C"), std::string::npos) << alerts[0].message;
  EXPECT_EQ(alerts[1].devices, std::vector<unsigned>{2});
  EXPECT_NE(alerts[1].message.find("312 of 400 W"), std::string::npos) << alerts[1].message;
  EXPECT_EQ(alerts[3].devices, std::vector<unsigned>{3});
}

TEST(TopAlerts, XidErrorsInTheKernelLogAlertPerGpuWithTheLastOnesMeaning) {
  TopSample sample = top_testing::two_gpu_sample();
  EXPECT_TRUE(xid_alerts(sample).empty());  // the log unread: nothing known, nothing raised
  sample.xid_log_read = true;
  EXPECT_TRUE(xid_alerts(sample).empty());
  sample.xids["0000:08:00.0"] = {79, 3};  // GPU 1's bus id, as the kernel log spells it
  const auto alerts = xid_alerts(sample);
  ASSERT_EQ(alerts.size(), 1u);
  EXPECT_EQ(alerts[0].kind, "xid");
  EXPECT_EQ(alerts[0].devices, std::vector<unsigned>{1});
  EXPECT_NE(alerts[0].message.find("GPU 1: 3 Xid errors"), std::string::npos) << alerts[0].message;
  EXPECT_NE(alerts[0].message.find("Xid 79 (GPU has fallen off the bus)"), std::string::npos) << alerts[0].message;
}

}  // namespace
}  // namespace lockstep::tools
