#include "lockstep/parallel/step_agreement.h"

#include <cstdint>
#include <vector>

#include "lockstep/comm/flight_recorder.h"
#include "lockstep/ops/ops.h"

namespace lockstep::parallel {
namespace {

// Every rank gets `reporter`'s text: its length, then its bytes (never empty: a failure
// names itself).
std::string broadcast_text(comm::Communicator& comm, const std::string& text, int reporter, Device device) {
  const bool mine = comm.rank() == reporter;
  const Tensor length =
      Tensor::from_vector(std::vector<int64_t>{mine ? static_cast<int64_t>(text.size()) : 0}, {1}, device);
  comm.broadcast(length, reporter);
  const int64_t bytes = length.to_vector<int64_t>().at(0);
  const Tensor message = mine ? Tensor::from_vector(std::vector<uint8_t>(text.begin(), text.end()), {bytes}, device)
                              : Tensor::zeros({bytes}, DType::u8, device);
  comm.broadcast(message, reporter);
  const std::vector<uint8_t> received = message.to_vector<uint8_t>();
  return std::string(received.begin(), received.end());
}

}  // namespace

AgreedStep agree_on_step(comm::Communicator& comm, const Tensor& loss, const std::string& failure, Device device) {
  const comm::FlightPhase phase("agreeing on the step");
  const bool failed_here = !failure.empty();
  LOCKSTEP_CHECK(failed_here || (loss.defined() && loss.numel() == 1))
      << "agree_on_step: a rank that finished its share brings its one-element loss";
  // Summed per element in the tree's order, so the loss has the bits its own all-reduce
  // gives, and the second element counts the ranks that failed (exact in f64).
  const Tensor agreement = Tensor::from_vector(std::vector<double>{0.0, failed_here ? 1.0 : 0.0}, {2}, device);
  if (!failed_here) slice(agreement, 0, 0, 1).copy_from(loss);
  comm.all_reduce(agreement);
  const std::vector<double> agreed = agreement.to_vector<double>();
  const auto failed = static_cast<int64_t>(agreed.at(1));
  if (failed == 0) return {.loss = agreed.at(0), .failure = ""};

  // The lowest failed rank reports, so the text does not depend on timing.
  const Tensor lowest = Tensor::from_vector(std::vector<int64_t>{failed_here ? comm.rank() : comm.size()}, {1}, device);
  comm.all_reduce(lowest, comm::ReduceOp::min);
  const int reporter = static_cast<int>(lowest.to_vector<int64_t>().at(0));
  const std::string others =
      failed > 1 ? " (and " + std::to_string(failed - 1) + " other rank" + (failed > 2 ? "s" : "") + ")" : "";
  return {
      .loss = 0,
      .failure = "rank " + std::to_string(reporter) + others + ": " + broadcast_text(comm, failure, reporter, device)};
}

}  // namespace lockstep::parallel
