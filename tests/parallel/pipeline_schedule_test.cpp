// Pipeline schedules against their definitions: every micro-batch once forward then once
// backward, backwards in order, GPipe holding M micro-batches and 1F1B at most P - stage;
// the bubble formula; stages balanced by parameters and given by --stages.
#include "lockstep/parallel/pipeline_schedule.h"

#include <gtest/gtest.h>

#include "lockstep/core/error.h"
#include "lockstep/parallel/device_mesh.h"

namespace lockstep::parallel {
namespace {

std::string render(const std::vector<PipelineOp>& ops) {
  std::string out;
  for (const PipelineOp& op : ops) {
    out += op.forward ? 'F' : 'B';
    out += std::to_string(op.micro_batch);
  }
  return out;
}

TEST(PipelineSchedule, GpipeRunsEveryForwardThenEveryBackward) {
  EXPECT_EQ(render(pipeline_ops(PipelineSchedule::gpipe, 0, 2, 3)), "F0F1F2B0B1B2");
  EXPECT_EQ(render(pipeline_ops(PipelineSchedule::gpipe, 1, 2, 3)), "F0F1F2B0B1B2");
}

TEST(PipelineSchedule, OneFOneBWarmsUpThenAlternates) {
  EXPECT_EQ(render(pipeline_ops(PipelineSchedule::one_f_one_b, 0, 4, 6)), "F0F1F2F3B0F4B1F5B2B3B4B5");
  EXPECT_EQ(render(pipeline_ops(PipelineSchedule::one_f_one_b, 2, 4, 6)), "F0F1B0F2B1F3B2F4B3F5B4B5");
  EXPECT_EQ(render(pipeline_ops(PipelineSchedule::one_f_one_b, 3, 4, 6)), "F0B0F1B1F2B2F3B3F4B4F5B5");
  // Fewer micro-batches than stages: every forward is warm-up.
  EXPECT_EQ(render(pipeline_ops(PipelineSchedule::one_f_one_b, 0, 4, 2)), "F0F1B0B1");
}

TEST(PipelineSchedule, ActivationsHeldAreMForGpipeAndAtMostPFor1F1B) {
  for (int stages : {1, 2, 4, 8}) {
    for (int64_t micro : {1, 2, 8, 16}) {
      for (int stage = 0; stage < stages; ++stage) {
        const auto gpipe = pipeline_ops(PipelineSchedule::gpipe, stage, stages, micro);
        const auto one = pipeline_ops(PipelineSchedule::one_f_one_b, stage, stages, micro);
        EXPECT_EQ(most_in_flight(gpipe), micro);
        EXPECT_EQ(most_in_flight(one), std::min<int64_t>(stages - stage, micro));
        // Each micro-batch forward once, then backward once; backwards in micro-batch order.
        for (const auto& ops : {gpipe, one}) {
          ASSERT_EQ(static_cast<int64_t>(ops.size()), 2 * micro);
          std::vector<int> forwarded(static_cast<size_t>(micro));
          int64_t next_backward = 0;
          for (const PipelineOp& op : ops) {
            if (op.forward) {
              ++forwarded[static_cast<size_t>(op.micro_batch)];
            } else {
              EXPECT_EQ(op.micro_batch, next_backward++);
              EXPECT_EQ(forwarded[static_cast<size_t>(op.micro_batch)], 1);
            }
          }
        }
      }
    }
  }
}

TEST(PipelineSchedule, TheoreticalBubble) {
  EXPECT_DOUBLE_EQ(theoretical_bubble(1, 8), 0.0);
  EXPECT_DOUBLE_EQ(theoretical_bubble(2, 8), 1.0 / 9.0);
  EXPECT_DOUBLE_EQ(theoretical_bubble(4, 4), 3.0 / 7.0);
  EXPECT_THROW(parse_pipeline_schedule("interleaved"), Error);
  EXPECT_EQ(parse_pipeline_schedule("1f1b"), PipelineSchedule::one_f_one_b);
}

TEST(PipelineSchedule, StagesBalanceParameters) {
  // Equal blocks, no extras: as even as it goes, the earlier stages taking the extra block.
  EXPECT_EQ(balance_stages(4, 10, 0, 0, 2), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(balance_stages(5, 10, 0, 0, 2), (std::vector<int64_t>{3, 2}));
  // A heavy embedding on the first stage moves blocks to the others.
  EXPECT_EQ(balance_stages(4, 10, 25, 0, 2), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(balance_stages(8, 10, 0, 0, 8), std::vector<int64_t>(8, 1));
  EXPECT_THROW(balance_stages(2, 10, 0, 0, 3), Error);
}

TEST(PipelineSchedule, StageSizesFromTheFlag) {
  EXPECT_EQ(parse_stage_sizes("3,1", 4, 2), (std::vector<int64_t>{3, 1}));
  try {
    parse_stage_sizes("2,1", 4, 2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 counts that sum to 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_stage_sizes("4,0", 4, 2), Error);
  EXPECT_THROW(parse_stage_sizes("2,x", 4, 2), Error);
}

TEST(DeviceMesh, RanksAndCoordinatesRoundTrip) {
  const MeshShape shape{.dp = 2, .tp = 2, .pp = 2};
  for (int r = 0; r < 8; ++r) EXPECT_EQ(mesh_rank(shape, mesh_coord(shape, r)), r);
  // Tensor-parallel ranks are neighbours; pipeline stages farthest apart.
  EXPECT_EQ(mesh_coord(shape, 1).tp, 1);
  EXPECT_EQ(mesh_coord(shape, 2).dp, 1);
  EXPECT_EQ(mesh_coord(shape, 4).pp, 1);
  EXPECT_EQ(check_mesh(shape, 8), "");
  EXPECT_NE(check_mesh(shape, 6).find("needs 8 devices, not 6"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::parallel
