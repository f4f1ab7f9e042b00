#include "lockstep/parallel/distributed_data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "lockstep/comm/flight_recorder.h"
#include "lockstep/ops/ops.h"
#include "lockstep/parallel/sharded_loss_scaling.h"
#include "lockstep/parallel/step_agreement.h"

namespace lockstep::parallel {
namespace {

// Buckets over the parameters in reverse order (backward's order), each closed once it
// holds `limit` bytes: the first with first_limit, so the first all-reduce starts early.
// The parameter count of each, for FlatGradients' units.
std::vector<size_t> plan_buckets(const std::vector<Tensor>& params, int64_t first_limit, int64_t limit) {
  std::vector<size_t> sizes;
  if (params.empty()) return sizes;  // FlatGradients names the problem
  const int64_t element = static_cast<int64_t>(dtype_size(params.front().dtype()));
  size_t count = 0;
  int64_t bytes = 0;
  for (size_t i = params.size(); i-- > 0;) {
    ++count;
    bytes += params[i].numel() * element;
    if (bytes >= (sizes.empty() ? first_limit : limit)) {
      sizes.push_back(count);
      count = 0;
      bytes = 0;
    }
  }
  if (count > 0) sizes.push_back(count);
  return sizes;
}

// ZeRO-2: reduce-scatters a rank lets run before it waits for the oldest.
constexpr size_t kBucketsInFlight = 2;

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> model,
                                                 const OptimizerFactory& make_optimizer,
                                                 std::shared_ptr<comm::Communicator> comm,
                                                 const DistributedDataParallelOptions& options)
    : model_(std::move(model)),
      comm_(std::move(comm)),
      options_(options),
      gather_plan_(options.zero_stage == 3 ? plan_gathering(*model_, options.zero3_unit_types) : GatherPlan{}),
      gradients_(model_->parameters(), comm_->size(),
                 options.zero_stage == 3
                     ? gather_plan_.unit_sizes
                     : plan_buckets(model_->parameters(), options.first_bucket_bytes, options.bucket_bytes)),
      statistics_(*model_),
      tree_(options.gradient_dtype) {
  check_loss_function("DistributedDataParallel", options.loss);
  LOCKSTEP_CHECK(options.micro_batch >= 1)
      << "the micro-batch must hold at least one sample, got " << options.micro_batch;
  LOCKSTEP_CHECK(options.bucket_bytes >= 1 && options.first_bucket_bytes >= 1)
      << "bucket sizes must be at least one byte, got " << options.first_bucket_bytes << " (first) and "
      << options.bucket_bytes;
  LOCKSTEP_CHECK(options.zero_stage >= 0 && options.zero_stage <= 3)
      << "ZeRO stage " << options.zero_stage
      << " does not exist: 0 (none), 1 (optimizer state), 2 (and gradients) or 3 (and weights)";
  // Every rank starts from rank 0's weights and buffers.
  for (const auto& [name, tensor] : model_->state_dict()) comm_->broadcast(tensor, 0);
  check_precision(options.precision, gradients_.params().front().device());
  if (options.precision == DType::f16) scaler_.emplace();
  LOCKSTEP_CHECK(options.gradient_dtype == DType::f32 || options.gradient_dtype == DType::bf16)
      << "gradients cross between ranks in f32 or bf16, not " << dtype_name(options.gradient_dtype);
  LOCKSTEP_CHECK(options.sync_every >= 1) << "sync_every must be at least 1, got " << options.sync_every;
  LOCKSTEP_CHECK(options.sync_every == 1 || (options.zero_stage == 0 && options.gradient_dtype == DType::f32))
      << "local SGD (sync_every " << options.sync_every
      << ") sends no gradients: it combines with neither ZeRO nor bf16 gradients";
  if (options.powersgd_rank != 0) {
    LOCKSTEP_CHECK(options.powersgd_rank > 0 && options.powersgd_start_step >= 0)
        << "PowerSGD needs a rank of at least 1 and a start step of 0 or more, got rank " << options.powersgd_rank
        << " from step " << options.powersgd_start_step;
    LOCKSTEP_CHECK(options.zero_stage == 0 && options.sync_every == 1 && options.gradient_dtype == DType::f32)
        << "PowerSGD combines with neither ZeRO, local SGD nor bf16 gradients: give one of them";
    powersgd_ = std::make_unique<PowerSgd>(gradients_, options.powersgd_rank, /*seed=*/0);
  }
  if (options.gradient_dtype != DType::f32) {
    LOCKSTEP_CHECK(options.zero_stage == 0) << "bf16 gradients are not supported with ZeRO yet: use zero_stage 0";
    LOCKSTEP_CHECK(gradients_.params().front().device().is_cpu() && gradients_.params().front().dtype() == DType::f32)
        << "bf16 gradients need f32 parameters on CPU devices for now, got "
        << dtype_name(gradients_.params().front().dtype()) << " on " << gradients_.params().front().device();
  }
  // Ranks that share host memory keep one copy of the weights and shard the optimizer
  // (f16's loss scaler needs every rank to see every sum, and runs on GPUs only anyway).
  // Local SGD's replicas differ between averagings, so each keeps its own copy.
  // ZeRO-3 keeps no full copy to share.
  const bool common = options.zero_stage < 3 && options.share_weights && comm_->shares_memory() &&
                      gradients_.params().front().device().is_cpu() && !scaler_ && !local_sgd();
  if (options.zero_stage > 0 || common) {
    sharded_ = std::make_unique<ShardedOptimizer>(gradients_, *comm_, make_optimizer, common, options.zero_stage == 3);
    if (options.zero_stage == 3)
      gathering_ = std::make_unique<ParameterGathering>(gather_plan_, gradients_, *sharded_->sharded_weights());
  } else {
    optimizer_ = make_optimizer(model_->parameters());
    // This rank's weights are its own and only its model reads them: its forward may run
    // while an offloaded optimizer still updates them (the model's readers wait).
    read_guard_ = std::make_unique<optim::ParameterReadGuard>(std::vector<nn::Module*>{model_.get()},
                                                              std::vector<optim::Optimizer*>{optimizer_.get()});
  }

  // The final micro-batch's gradients are reduced where they lie: in memory the peers can
  // read (shared memory under `shm`), allocated once, so the all-reduce needs no staging copy.
  // ZeRO-2 and 3 instead make each bucket's buffer as backward reaches it.
  const Tensor sample = gradients_.params().front();
  if (options.zero_stage < 2)
    reduced_ = comm_->empty_shared({gradients_.padded_numel()}, sample.dtype(), sample.device());
  if (options.gradient_dtype != sample.dtype()) {
    wire_ = comm_->empty_shared({gradients_.padded_numel()}, options.gradient_dtype, sample.device());
  }
  buckets_ = gradients_.units();
  bucket_of_.resize(gradients_.params().size());
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (size_t p : buckets_[b].params) bucket_of_[p] = b;
  for (size_t i = 0; i < gradients_.params().size(); ++i) {
    gradients_.params()[i].set_post_accumulate_grad_hook([this, i] { on_gradient_ready(i); });
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  for (const Tensor& p : gradients_.params()) p.set_post_accumulate_grad_hook(nullptr);
}

nn::Module& DistributedDataParallel::model() {
  if (gathering_) gathering_->gather_all();
  return *model_;
}

void DistributedDataParallel::load_model_state(const NamedTensors& state) {
  if (gathering_) {
    sharded_->sharded_weights()->write_all([&] { model_->load_state_dict(state); });
    return;
  }
  if (!sharded_ || !sharded_->common_weights()) {
    model_->load_state_dict(state);
    return;
  }
  // One copy of the weights serves every rank: rank 0 writes it, the others load only their
  // buffers (their parameters' entries become the copy itself, which loading leaves as it
  // is), and no rank computes with it before it is written.
  NamedTensors own = state;
  if (comm_->rank() != 0) {
    const NamedTensors params = model_->named_parameters();
    for (auto& [name, tensor] : own) {
      const auto param = std::find_if(params.begin(), params.end(), [&](const auto& p) { return p.first == name; });
      if (param != params.end()) tensor = param->second;
    }
  }
  try {
    model_->load_state_dict(own);
  } catch (const std::exception& error) {
    comm_->abort("rank " + std::to_string(comm_->rank()) + ": " + error.what());
    throw;
  }
  comm_->barrier();
}

void DistributedDataParallel::set_lr(double lr) {
  if (sharded_) {
    sharded_->set_lr(lr);
  } else {
    optimizer_->set_lr(lr);
  }
}

double DistributedDataParallel::lr() const { return sharded_ ? sharded_->lr() : optimizer_->lr(); }

NamedTensors DistributedDataParallel::own_optimizer_state() {
  NamedTensors state = optimizer_->state_dict();
  if (scaler_) {
    for (auto& entry : scaler_->state_dict()) state.push_back(std::move(entry));
  }
  return state;
}

NamedTensors DistributedDataParallel::optimizer_state() {
  NamedTensors state = sharded_ ? sharded_->full_state_dict() : own_optimizer_state();
  add_powersgd_state(state, -1);
  return state;
}

NamedTensors DistributedDataParallel::optimizer_state_on(int root) {
  NamedTensors state = sharded_                ? sharded_->full_state_dict(root)
                       : comm_->rank() == root ? own_optimizer_state()
                                               : NamedTensors{};  // every rank has it already
  add_powersgd_state(state, root);
  return state;
}

// PowerSGD's Q is every rank's; each rank's error is its own, so a checkpoint holds one per
// rank ("powersgd.error.rank<r>") and resumes on as many ranks.
void DistributedDataParallel::add_powersgd_state(NamedTensors& state, int root) {
  if (!powersgd_) return;
  const NamedTensors mine = powersgd_->state();
  const Tensor& q = mine.at(0).second;
  const Tensor& error = mine.at(1).second;
  const bool keeps = root < 0 || comm_->rank() == root;
  if (keeps) state.emplace_back("powersgd.q", q.clone());
  for (int r = 0; r < comm_->size(); ++r) {
    const std::string name = "powersgd.error.rank" + std::to_string(r);
    Tensor theirs = r == comm_->rank() ? error.clone() : Tensor::empty(error.shape(), error.dtype());
    if (root < 0) {
      comm_->broadcast(theirs, r);
    } else if (r != root) {
      if (comm_->rank() == r) comm_->send(theirs, root);
      if (comm_->rank() == root) comm_->recv(theirs, r);
    }
    if (keeps) state.emplace_back(name, theirs);
  }
}

void DistributedDataParallel::load_optimizer_state(const NamedTensors& state) {
  NamedTensors optimizer_state;
  NamedTensors powersgd_state;
  int errors = 0;
  const std::string own_error = "powersgd.error.rank" + std::to_string(comm_->rank());
  for (const auto& [name, tensor] : state) {
    if (!name.starts_with("powersgd.")) {
      optimizer_state.emplace_back(name, tensor);
      continue;
    }
    if (name == "powersgd.q") powersgd_state.emplace_back("q", tensor);
    if (name.starts_with("powersgd.error.rank")) ++errors;
    if (name == own_error) powersgd_state.emplace_back("error", tensor);
  }
  LOCKSTEP_CHECK(errors == 0 || errors == comm_->size())
      << "this checkpoint's PowerSGD error feedback is of " << errors << " ranks; each rank's is its own, so resume on "
      << errors << " ranks, not " << comm_->size();
  LOCKSTEP_CHECK(errors == 0 || powersgd_) << "this checkpoint holds PowerSGD state: resume with PowerSGD on";
  if (powersgd_ && !powersgd_state.empty()) powersgd_->load_state(powersgd_state);
  if (sharded_) {
    sharded_->load_full_state_dict(optimizer_state);
    return;
  }
  const NamedTensors scaler_state = optim::extract_scaler_state(optimizer_state);
  if (scaler_ && !scaler_state.empty()) scaler_->load_state_dict(scaler_state);
  optimizer_->load_state_dict(optimizer_state);
}

int64_t DistributedDataParallel::optimizer_state_bytes() const {
  return sharded_ ? sharded_->state_bytes() : optimizer_->state_bytes();
}

void DistributedDataParallel::on_gradient_ready(size_t param) {
  if (accumulating_) accumulating_->take(param);
  if (collecting_ && !taken_[param]) {
    take_gradient(param);
    if (options_.zero_stage != 1 && !hold_buckets_) start_ready_buckets();  // ZeRO-1 reduce-scatters after backward
  }
  if (gathering_) gathering_->gradient_done(param);  // its unit may go
}

void DistributedDataParallel::take_gradient(size_t param) {
  const size_t bucket = bucket_of_[param];
  if (options_.zero_stage >= 2) {
    gradients_.take(param, bucket_buffer(bucket), buckets_[bucket].begin);
  } else {
    gradients_.take(param, last_leaf_);
  }
  taken_[param] = true;
  --missing_[bucket];
}

const Tensor& DistributedDataParallel::bucket_buffer(size_t b) {
  release_sent_buckets();
  Tensor& buffer = bucket_buffers_[b];
  if (buffer.defined()) return buffer;
  const GradientBucket& bucket = buckets_[b];
  const Tensor& sample = gradients_.params().front();
  buffer = Tensor::empty({bucket.end - bucket.begin}, sample.dtype(), sample.device());
  if (bucket.params_end < bucket.end)
    slice(buffer, 0, bucket.params_end - bucket.begin, bucket.end - bucket.begin).zero();
  for (size_t p : bucket.params)
    if (!taken_[p]) gradients_.params()[p].set_grad_destination(gradients_.view(buffer, p, bucket.begin));
  return buffer;
}

void DistributedDataParallel::release_sent_buckets() {
  while (released_ < sending_.size() && works_[released_].done()) sending_[released_++] = Tensor();
}

void DistributedDataParallel::wait_for_collectives() {
  for (const comm::Work& work : works_) work.wait();
  works_.clear();
  sending_.clear();
  released_ = 0;
}

void DistributedDataParallel::clear_grad_destinations() {
  for (const Tensor& p : gradients_.params()) p.set_grad_destination(Tensor());
}

void DistributedDataParallel::start_ready_buckets() {
  // next_bucket_ moves past a bucket only once its collective is started: a rank that runs
  // out of memory on the way owes the others every bucket from there (pay_owed_collectives).
  while (next_bucket_ < buckets_.size() && missing_[next_bucket_] == 0) {
    const size_t b = next_bucket_;
    const GradientBucket& bucket = buckets_[b];
    if (options_.zero_stage >= 2) {
      // This rank's subtree over the bucket, then its part of the tree's top across ranks
      // into the shard; the bucket is released once sent.
      Tensor buffer = std::move(bucket_buffers_[b]);
      for (size_t p : bucket.params) gradients_.params()[p].set_grad_destination(Tensor());
      tree_.finish_part(buffer, bucket.begin);
      const int64_t at = ShardedOptimizer::shard_offset(bucket, comm_->size());
      works_.push_back(
          comm_->reduce_scatter_async(buffer, slice(grad_shard_, 0, at, at + bucket.shard_size(comm_->size()))));
      sending_.push_back(std::move(buffer));
      ++next_bucket_;
      // Two buckets in flight at most: a rank ahead of its peers waits for them here rather
      // than hold every bucket it fills (DeepSpeed bounds stage 2's buckets alike).
      while (sending_.size() - released_ > kBucketsInFlight) {
        works_[released_].wait();
        sending_[released_++] = Tensor();
      }
      continue;
    }
    // This rank's subtree over the bucket's range, then the tree's top across ranks.
    tree_.finish_range(last_leaf_, bucket.begin, bucket.end);
    if (!wire_.defined()) {
      works_.push_back(comm_->all_reduce_async(slice(last_leaf_, 0, bucket.begin, bucket.end)));
      ++next_bucket_;
      continue;
    }
    // The subtree is bf16-exact already: converting it loses nothing, and rounded_sum
    // rounds the rest of the tree as the rank rounded its part.
    const Tensor wire = slice(wire_, 0, bucket.begin, bucket.end);
    convert_elements(slice(last_leaf_, 0, bucket.begin, bucket.end).data_ptr(), last_leaf_.dtype(), wire.data_ptr(),
                     wire.dtype(), wire.numel());
    works_.push_back(comm_->all_reduce_async(wire, comm::ReduceOp::rounded_sum));
    ++next_bucket_;
  }
  if (options_.zero_stage >= 2) {
    // The next buckets' buffers exist before backward reaches them, so their linear layers
    // compute their weights' gradients in place.
    for (size_t b = next_bucket_; b < std::min(next_bucket_ + 2, buckets_.size()); ++b) bucket_buffer(b);
  }
}

void DistributedDataParallel::unpack_wire() {
  if (!wire_.defined()) return;
  for (const GradientBucket& bucket : buckets_) {
    const Tensor wire = slice(wire_, 0, bucket.begin, bucket.end);
    convert_elements(wire.data_ptr(), wire.dtype(), slice(last_leaf_, 0, bucket.begin, bucket.end).data_ptr(),
                     last_leaf_.dtype(), wire.numel());
  }
}

std::vector<Device> DistributedDataParallel::local_devices() const { return {gradients_.params().front().device()}; }

StepResult DistributedDataParallel::step(const TensorBatch& global_batch, const StepContext& context) {
  const int64_t share = global_batch.size() / comm_->size();
  LOCKSTEP_CHECK(share * comm_->size() == global_batch.size())
      << "a global batch of " << global_batch.size() << " samples does not split evenly over " << comm_->size()
      << " ranks: make the global batch a multiple of the rank count";
  const int64_t first = comm_->rank() * share;
  return step_on_share(global_batch.slice(first, share),
                       {.seed = context.seed, .step = context.step, .first_sample = context.first_sample + first});
}

StepResult DistributedDataParallel::step_on_share(const TensorBatch& share, const StepContext& context) {
  StepResult result;
  result.devices.resize(1);
  std::string failure;
  try {
    failure = run_step(share, context, result);
  } catch (const std::exception& error) {
    collecting_ = false;
    clear_grad_destinations();
    for (const comm::Work& work : works_) {
      try {
        work.wait();  // none may still read last_leaf_ or a bucket
      } catch (const std::exception&) {
      }
    }
    works_.clear();
    sending_.clear();
    released_ = 0;
    placeholders_.clear();
    bucket_buffers_.clear();
    grad_shard_ = Tensor();
    tree_.clear();
    if (gathering_) gathering_->abandon();
    group_ended_ = true;
    comm_->abort("rank " + std::to_string(comm_->rank()) + ": " + error.what());
    throw;
  }
  // Every rank throws it, having changed nothing: the step may be taken again.
  if (!failure.empty()) throw OutOfMemoryError(failure);
  return result;
}

std::string DistributedDataParallel::run_step(const TensorBatch& share, const StepContext& context,
                                              StepResult& result) {
  DeviceTimes& times = result.devices[0];
  StepClock::time_point start = StepClock::now();
  times.started = std::chrono::duration<double>(start.time_since_epoch()).count();
  const int64_t local = share.size();
  LOCKSTEP_CHECK(local > 0) << "a step needs samples on every rank; rank " << comm_->rank() << " got none";
  const int64_t batch = local * comm_->size();
  const std::string layout_error = check_step_layout(batch, options_.micro_batch, comm_->size());
  LOCKSTEP_CHECK(layout_error.empty()) << layout_error;
  // Local SGD's step is the share's own: its gradients are the share's mean.
  const int64_t normalizer = local_sgd() ? local : batch;
  hold_buckets_ = local_sgd() || compresses(context);
  next_bucket_ = 0;

  // The loss and the running statistics, leaf by leaf, folded in the same order.
  GradientTree losses;
  Tensor loss;
  std::vector<Tensor> statistic_sums;
  std::string ran_out;  // this rank's out-of-memory error, which every rank must hear of
  try {
    compute_share(share, context, normalizer, losses);
    std::vector<Tensor> folded = losses.finish();
    loss = folded[0];
    statistic_sums.assign(folded.begin() + 1, folded.end());
  } catch (const OutOfMemoryError& error) {
    if (!agrees_on_failures()) throw;
    ran_out = error.what();
    abandon_step();
    try {
      pay_owed_collectives();
    } catch (const OutOfMemoryError& again) {
      LOCKSTEP_FAIL() << ran_out << "; and then no room was left for the placeholders of the collectives this rank "
                      << "owes the others (" << again.what() << "), so the step cannot be taken again";
    }
  }
  times.compute = seconds_since(start);

  start = StepClock::now();
  if (local_sgd()) {
    result.loss = loss.item();  // this rank's share's loss: local SGD sends nothing per step
  } else {
    // Queued behind the buckets' collectives, so backward's overlap with them is kept.
    const AgreedStep agreed = agree_on_step(*comm_, loss, ran_out, gradients_.params().front().device());
    if (!agreed.failure.empty()) {
      wait_for_collectives();  // what they read or write may go only now
      placeholders_.clear();
      abandon_step();
      times.communicate = seconds_since(start);
      return agreed.failure;
    }
    result.loss = agreed.loss;
  }
  times.communicate = seconds_since(start);
  try {
    update(statistic_sums, context, result);
  } catch (const OutOfMemoryError& error) {
    LOCKSTEP_FAIL() << error.what() << " (after every rank had agreed to take the step, while the gradients were "
                    << "reduced and the weights updated, so the weights may be partly updated: continue from the "
                    << "last checkpoint)";
  }
  return "";
}

void DistributedDataParallel::compute_share(const TensorBatch& share, const StepContext& context, int64_t normalizer,
                                            GradientTree& losses) {
  const int64_t local = share.size();
  const int64_t micro = options_.micro_batch;
  const Device device = gradients_.params().front().device();  // the samples go where the model is
  statistics_.discard();
  for (int64_t first = 0; first < local; first += micro) {
    const bool last = first + micro == local;
    if (last) {
      taken_.assign(gradients_.params().size(), false);
      missing_.clear();
      for (const GradientBucket& bucket : buckets_) missing_.push_back(bucket.params.size());
      next_bucket_ = 0;
      collecting_ = true;
      if (options_.zero_stage >= 2) {
        grad_shard_ = Tensor::empty({sharded_->shard_size()}, gradients_.params().front().dtype(), device);
        bucket_buffers_.assign(buckets_.size(), Tensor());
        for (size_t b = 0; b < std::min<size_t>(2, buckets_.size()); ++b) bucket_buffer(b);
      } else {
        last_leaf_ = reduced_;
        gradients_.zero_padding(last_leaf_);  // the units' padding
        // Ops that can compute a weight's gradient straight into its place in the bucket
        // (linear layers), so the hook has nothing to copy.
        for (size_t i = 0; i < gradients_.params().size(); ++i)
          gradients_.params()[i].set_grad_destination(gradients_.view(last_leaf_, i));
      }
    }
    // The earlier micro-batches' gradients go straight into a buffer of their own, leaf of
    // the rank's subtree (no .grad beside it).
    if (!last) accumulating_.emplace(gradients_, /*hooks=*/false);
    const Precision precision{options_.precision, scaler_ ? scaler_->scale() : 1.0};
    if (gathering_) gathering_->begin_pass();
    std::vector<Tensor> leaf = {
        run_micro_batch(*model_, options_.loss, share, first, micro, normalizer, context, device, precision)};
    if (gathering_) gathering_->end_pass();
    for (Tensor& entry : statistics_.take()) leaf.push_back(std::move(entry));
    losses.add_leaf(std::move(leaf));
    if (!last) {
      tree_.add_leaf({accumulating_->finish()});
      accumulating_.reset();
    }
  }
  // Parameters backward did not reach (unused in this step) count as zeros.
  collecting_ = false;
  clear_grad_destinations();
  for (size_t i = 0; i < gradients_.params().size(); ++i) {
    if (!taken_[i]) take_gradient(i);
  }
  if (options_.zero_stage == 1 || hold_buckets_) {
    tree_.finish_range(last_leaf_, 0, last_leaf_.numel());
    // Made before the agreement, so that running out of room for it is agreed on too.
    if (options_.zero_stage == 1)
      grad_shard_ = Tensor::empty({sharded_->shard_size()}, last_leaf_.dtype(), last_leaf_.device());
  } else {
    start_ready_buckets();
  }
  if (gathering_) gathering_->end_step();
}

void DistributedDataParallel::update(const std::vector<Tensor>& statistic_sums, const StepContext& context,
                                     StepResult& result) {
  DeviceTimes& times = result.devices[0];
  StepClock::time_point start = StepClock::now();
  if (compresses(context)) {
    const comm::FlightPhase phase("PowerSGD");
    powersgd_->reduce(last_leaf_, *comm_);
  }
  wait_for_collectives();
  bucket_buffers_.clear();
  tree_.clear();
  unpack_wire();
  if (!statistic_sums.empty()) {
    if (!local_sgd()) {
      for (const Tensor& sum : statistic_sums) comm_->all_reduce(sum);
    }
    statistics_.apply(statistic_sums);
  }
  times.communicate += seconds_since(start);
  if (sharded_) {
    // f16: each rank unscales its shard and the ranks agree on skipping.
    const UpdateGate gate = scaler_ ? loss_scaled_gate(*scaler_, *comm_, &result.skipped) : nullptr;
    if (options_.zero_stage >= 2) {
      sharded_->step_shard(grad_shard_, times, gate);
    } else if (options_.zero_stage == 1) {
      const comm::FlightPhase phase("optimizer");
      sharded_->step(last_leaf_, times, grad_shard_, gate);
    } else {
      sharded_->step_reduced(last_leaf_, times, gate);
    }
    grad_shard_ = Tensor();
    last_leaf_ = Tensor();
    return;
  }
  start = StepClock::now();
  bool finite = true;
  if (scaler_) {  // every rank sees the same sum, so all decide alike
    finite = scaler_->unscale({last_leaf_});
    scaler_->update(finite);
    result.skipped = !finite;
  }
  gradients_.give(last_leaf_);
  {
    const comm::FlightPhase phase("optimizer");
    if (finite) optimizer_->step();
  }
  optimizer_->zero_grad();
  last_leaf_ = Tensor();
  times.optimizer = seconds_since(start);
  if (local_sgd()) {
    replicas_agree_ = false;
    if ((context.step + 1) % static_cast<uint64_t>(options_.sync_every) == 0) {
      start = StepClock::now();
      average_replicas();
      times.communicate += seconds_since(start);
    }
  }
}

void DistributedDataParallel::average(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> packed;  // f32: one all-reduce for all of them
  int64_t numel = 0;
  for (const Tensor& t : tensors) {
    if (!is_floating(t.dtype())) continue;  // counters are the same on every rank
    if (t.dtype() == DType::f32 && t.is_contiguous() && t.device().is_cpu()) {
      packed.push_back(t);
      numel += t.numel();
    } else {
      comm_->all_reduce(t, comm::ReduceOp::avg);
    }
  }
  if (packed.empty()) return;
  const Tensor flat = Tensor::empty({numel}, DType::f32);
  int64_t at = 0;
  for (const Tensor& t : packed) {
    std::memcpy(flat.data_ptr<float>() + at, t.data_ptr<float>(), static_cast<size_t>(t.numel()) * sizeof(float));
    at += t.numel();
  }
  comm_->all_reduce(flat, comm::ReduceOp::avg);
  at = 0;
  for (const Tensor& t : packed) {
    std::memcpy(t.data_ptr<float>(), flat.data_ptr<float>() + at, static_cast<size_t>(t.numel()) * sizeof(float));
    at += t.numel();
  }
}

void DistributedDataParallel::average_replicas() {
  const comm::FlightPhase phase("averaging replicas");
  std::vector<Tensor> model_state;
  for (const auto& [name, tensor] : model_->state_dict()) model_state.push_back(tensor);
  average(model_state);
  // The optimizer state too: afterwards every rank holds one state, which a checkpoint of
  // rank 0's restores on every rank.
  NamedTensors state = optimizer_->state_dict();
  std::vector<Tensor> state_tensors;
  for (const auto& [name, tensor] : state) state_tensors.push_back(tensor);
  average(state_tensors);
  optimizer_->load_state_dict(state);
  replicas_agree_ = true;
}

int64_t DistributedDataParallel::max_over_processes(int64_t value) {
  const Tensor flag = Tensor::from_vector(std::vector<double>{static_cast<double>(value)}, {1});
  comm_->all_reduce(flag, comm::ReduceOp::max);
  return static_cast<int64_t>(flag.item());
}

void DistributedDataParallel::give_up(const std::string& reason) {
  comm_->abort("rank " + std::to_string(comm_->rank()) + ": " + reason);
}

}  // namespace lockstep::parallel
