// The rows of `lockstep bench collectives`, from timings given here: nccl-tests' bandwidths,
// eta only where the update bandwidth was measured, and a reference's columns (MPI's, or
// NCCL's own reductions beside the tree order) with the speedup over it.
#include "tools/bench/collective_rows.h"

#include <gtest/gtest.h>

namespace lockstep::tools {
namespace {

Row row_of(Collective what, int64_t bytes, double seconds, double reference_seconds = 0, int64_t wrong = 0) {
  return Row{.what = what,
             .bytes = bytes,
             .ours = {.seconds = seconds, .wrong = wrong},
             .reference_seconds = reference_seconds};
}

RowSettings nccl_settings(int ranks) {
  return RowSettings{.backend = "nccl",
                     .route = "reductions in the tree order",
                     .ranks = ranks,
                     .dtype = DType::bf16,
                     .op = "sum",
                     .iters = 20,
                     .warmup = 5,
                     .reference = "nccl"};
}

TEST(CollectiveRows, BandwidthsAreNcclTests) {
  // 8 MB in 100 us on 4 ranks: algbw 80 GB/s; all_reduce busbw x 2*3/4, all_gather x 3/4.
  const RowSettings settings = nccl_settings(4);
  const nlohmann::json reduce = row_json(row_of(Collective::all_reduce, 8'000'000, 100e-6), settings);
  EXPECT_DOUBLE_EQ(reduce["algbw"].get<double>(), 80.0);
  EXPECT_DOUBLE_EQ(reduce["busbw"].get<double>(), 120.0);
  EXPECT_EQ(reduce["count"], 4'000'000) << "bf16 elements";
  EXPECT_EQ(reduce["type"], "bf16");
  EXPECT_DOUBLE_EQ(reduce["time_us"].get<double>(), 100.0);
  const nlohmann::json gather = row_json(row_of(Collective::all_gather, 8'000'000, 100e-6), settings);
  EXPECT_DOUBLE_EQ(gather["busbw"].get<double>(), 60.0);
  const nlohmann::json broadcast = row_json(row_of(Collective::broadcast, 8'000'000, 100e-6), settings);
  EXPECT_DOUBLE_EQ(broadcast["busbw"].get<double>(), 80.0);
}

TEST(CollectiveRows, TheReferenceGetsItsOwnColumnsAndTheSpeedup) {
  // The tree order at 125 us against NCCL's 100 us: speedup 0.8, NCCL's busbw by the same factor.
  const nlohmann::json j = row_json(row_of(Collective::all_reduce, 8'000'000, 125e-6, 100e-6), nccl_settings(2));
  EXPECT_DOUBLE_EQ(j["nccl_time_us"].get<double>(), 100.0);
  EXPECT_DOUBLE_EQ(j["nccl_busbw"].get<double>(), 80.0);
  EXPECT_DOUBLE_EQ(j["busbw"].get<double>(), 64.0);
  EXPECT_DOUBLE_EQ(j["speedup"].get<double>(), 0.8);
  EXPECT_EQ(j["route"], "reductions in the tree order");
  EXPECT_FALSE(j.contains("mpi_time_us"));
  EXPECT_FALSE(j.contains("nccl_wrong")) << "not checked";
  Row checked = row_of(Collective::all_reduce, 8'000'000, 125e-6, 100e-6);
  checked.reference_wrong = 3;
  EXPECT_EQ(row_json(checked, nccl_settings(2))["nccl_wrong"], 3);
  const nlohmann::json alone = row_json(row_of(Collective::all_reduce, 8'000'000, 125e-6), nccl_settings(2));
  EXPECT_FALSE(alone.contains("nccl_time_us"));
  EXPECT_FALSE(alone.contains("speedup"));
}

TEST(CollectiveRows, EtaOnlyForAllReduceWithAnUpdateBandwidth) {
  RowSettings settings = nccl_settings(2);
  EXPECT_FALSE(row_json(row_of(Collective::all_reduce, 1 << 20, 1e-3), settings).contains("eta"))
      << "GPUs have no B_update";
  settings.update_bandwidth = 4e9;
  // 2 ranks x 1 MiB in 1 ms against 4 GB/s.
  const nlohmann::json j = row_json(row_of(Collective::all_reduce, 1 << 20, 1e-3), settings);
  EXPECT_NEAR(j["eta"].get<double>(), 2.0 * (1 << 20) / 1e-3 / 4e9, 1e-12);
  EXPECT_FALSE(row_json(row_of(Collective::broadcast, 1 << 20, 1e-3), settings).contains("eta"));
}

TEST(CollectiveRows, TheTableNamesTheRunAndTheReference) {
  const std::vector<Row> rows = {row_of(Collective::all_reduce, 8'000'000, 125e-6, 100e-6),
                                 row_of(Collective::reduce_scatter, 8'000'000, 90e-6, 100e-6, -1)};
  const std::string table = rows_table(rows, nccl_settings(2));
  for (const char* text :
       {"backend nccl (reductions in the tree order), 2 ranks, bf16 sum, 20 iterations after 5", "nccl time(us)",
        "nccl busbw", "speedup", "0.80x", "1.11x", "speedup = nccl time / ours", "#wrong"}) {
    EXPECT_NE(table.find(text), std::string::npos) << text << "\n" << table;
  }
  EXPECT_EQ(table.find("B_update"), std::string::npos) << table;
  // An unchecked row shows "-" for #wrong; every row is one line, between header and footer.
  EXPECT_NE(table.find("       -      -"), std::string::npos) << table;
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 6) << table;
}

TEST(CollectiveRows, WithoutAReferenceNoItsColumns) {
  RowSettings settings = nccl_settings(2);
  settings.reference.clear();
  settings.update_bandwidth = 1e9;
  const std::string table = rows_table({row_of(Collective::all_reduce, 4096, 1e-5)}, settings);
  EXPECT_EQ(table.find("speedup"), std::string::npos) << table;
  EXPECT_NE(table.find("B_update (in-place update bandwidth of the same 2 ranks, for eta): 1.00 GB/s"),
            std::string::npos)
      << table;
}

}  // namespace
}  // namespace lockstep::tools
