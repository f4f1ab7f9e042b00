// What the flight recorder (lockstep/comm/flight_recorder.h) costs a collective: the time to
// record one call (issued, waiting, ended) beside the latency of the smallest collective it
// records, an all_reduce of 4 floats between two threads, where its share is largest.
//
//   build/bin/flight_recorder_cost [--calls N]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "lockstep/comm/flight_recorder.h"
#include "lockstep/comm/local_communicator.h"

namespace lockstep {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  using namespace lockstep;
  int64_t calls = 200000;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--calls") == 0) calls = std::atoll(argv[i + 1]);
  }
  comm::FlightRecorder& recorder = comm::FlightRecorder::process();
  // Recording alone, as a communicator does it for each call.
  auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < calls; ++i) {
    comm::FlightCall call;
    call.group = "world";
    call.call = "all_reduce";
    call.sequence = static_cast<uint64_t>(i + 1);
    call.count = 4;
    call.dtype = "f32";
    call.op = "sum";
    const uint64_t id = recorder.issued(std::move(call));
    recorder.started(id);
    recorder.ended(id);
  }
  const double record_ns = seconds_since(start) / static_cast<double>(calls) * 1e9;

  // The smallest collective, recorded: two ranks as threads.
  auto group = comm::LocalCommunicator::create_group(2);
  const int64_t reduces = calls / 4;
  start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      Tensor x = Tensor::full({4}, 1.0, DType::f32);
      for (int64_t i = 0; i < reduces; ++i) group[static_cast<size_t>(r)]->all_reduce(x);
    });
  }
  for (auto& t : threads) t.join();
  const double reduce_ns = seconds_since(start) / static_cast<double>(reduces) * 1e9;

  std::printf("%-44s %12s\n", "", "ns per call");
  std::printf("%-44s %12.0f\n", "recording one call (issued, waiting, ended)", record_ns);
  std::printf("%-44s %12.0f\n", "all_reduce of 4 f32, 2 threads, recorded", reduce_ns);
  std::printf("recording is %.1f%% of the smallest collective's time\n", 100 * record_ns / reduce_ns);
  return 0;
}
