// When ZeRO-3 gathers which parameters: the model's unit modules (FSDP's wrapped modules),
// each gathered just before its forward and again before its backward, the next one
// prefetched, and released right after each (the forward) or once backward has produced
// every gradient of the unit (the backward). So a rank holds the full values of about two
// units at a time besides group 0: the parameters outside every unit module, gathered for
// the whole step.
//
// Unit modules: those whose type name is in unit_types (the outermost, where they nest),
// or, with none given, the root's children. A parameter two unit modules share (tied
// weights) goes to group 0. Modules reach their children's hooks through operator()
// (Module::set_forward_hooks); a parameter used outside its module's forward — a tied
// head multiplying by the embedding's weight in the root's forward — must be in group 0:
// give the unit types (GPT: "GptBlock"). Reading a released parameter fails with that advice.
#pragma once

#include <string>
#include <vector>

#include "lockstep/nn/module.h"
#include "lockstep/parallel/flat_gradients.h"
#include "lockstep/parallel/sharded_weights.h"

namespace lockstep::parallel {

struct GatherPlan {
  std::vector<nn::Module*> modules;  // group g's module is modules[g - 1]; group 0 has none
  std::vector<size_t> group_of;      // per parameter of model.parameters()
  // FlatGradients' units: runs of parameters of one group, in buffer order (the last first).
  std::vector<size_t> unit_sizes;
};

GatherPlan plan_gathering(nn::Module& model, const std::vector<std::string>& unit_types);

class ParameterGathering {
 public:
  // layout: built with plan.unit_sizes; weights: over the same layout. Sets the unit
  // modules' forward hooks (removed by the destructor).
  ParameterGathering(const GatherPlan& plan, const FlatGradients& layout, ShardedWeights& weights);
  ~ParameterGathering();
  ParameterGathering(const ParameterGathering&) = delete;
  ParameterGathering& operator=(const ParameterGathering&) = delete;

  // Around each micro-batch's forward and backward: group 0 is gathered, the unit modules'
  // hooks gather and release, and afterwards every unit still held is released.
  void begin_pass();
  void end_pass();
  // Backward has produced parameter p's gradient (all of its contributions).
  void gradient_done(size_t param);
  // The step's end (the optimizer changes the parts): releases everything.
  void end_step();
  // Every parameter gathered, and kept outside steps (the model as one device holds it).
  void gather_all();
  // After a failed step: nothing in flight, nothing held.
  void abandon();

 private:
  void before_forward(size_t group);
  Tensor after_forward(size_t group, const Tensor& output);
  void before_backward(size_t group, size_t position);
  void gather(size_t group);
  void prefetch(size_t group);
  void release(size_t group);

  ShardedWeights& weights_;
  std::vector<nn::Module*> modules_;
  std::vector<size_t> group_of_;
  std::vector<std::vector<size_t>> units_of_;  // per group, its units of the flat buffer
  std::vector<size_t> sizes_;                  // per group, its parameter count
  std::vector<size_t> waiting_;                // per group, its gradients backward has still to produce
  std::vector<size_t> order_;                  // groups in the order this pass forwarded them
  std::vector<size_t> last_order_;             // the previous pass's: what forward prefetches
  bool in_pass_ = false;
  bool backward_started_ = false;  // this pass has reached backward
};

}  // namespace lockstep::parallel
