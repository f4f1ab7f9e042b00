// The mesh's full-model state: the full weights and the unsharded optimizer state gathered
// from the ranks that own them (replica 0; a replicated tensor, its tensor-parallel rank 0),
// on every rank or on one, and each rank's part taken back from them. Under ZeRO-1 replica
// 0's rank first assembles its parameters' state from its data-parallel group's shards.
#include <cstdlib>
#include <functional>
#include <map>

#include "lockstep/autograd/grad_mode.h"
#include "lockstep/ops/ops.h"
#include "lockstep/parallel/gpt_mesh.h"

namespace lockstep::parallel {
namespace {

// The position of the optimizer's slot named `name`, or slots.size() when it has none.
size_t slot_index(const std::vector<optim::StateSlot>& slots, const std::string& name) {
  size_t s = 0;
  while (s < slots.size() && slots[s].name != name) ++s;
  return s;
}

// Writes a shard (rank `rank` of `ranks`'s, cut as `spec` says) into its place in `full`.
void place_shard(const Tensor& full, const Tensor& shard, const ShardSpec& spec, int rank, int ranks) {
  if (spec.axis < 0) {
    full.copy_from(shard);
    return;
  }
  const int64_t n = full.size(spec.axis) / spec.parts, size = n / ranks;
  for (int64_t p = 0; p < spec.parts; ++p) {
    const int64_t begin = p * n + size * rank;
    slice(full, spec.axis, begin, begin + size).copy_from(slice(shard, spec.axis, p * size, (p + 1) * size));
  }
}

// Tensors of the given shapes, views of one buffer that every rank fills with the additive
// identity of its dtype — -0.0 for floats: x + (-0.0) is x, +0.0 and -0.0 included, where
// x + (+0.0) would turn a -0.0 into +0.0. Each element's owner writes its value, and one
// all-reduce gives every rank the owners' very bits.
class OwnersSum {
 public:
  OwnersSum(const std::vector<Shape>& shapes, DType dtype) {
    int64_t total = 0;
    for (const Shape& shape : shapes) total += numel(shape);
    buffer_ = Tensor::empty({total}, dtype);
    buffer_.fill(dtype == DType::f32 || dtype == DType::f64 ? -0.0 : 0.0);
    int64_t offset = 0;
    for (const Shape& shape : shapes) {
      views_.push_back(buffer_.as_strided(shape, contiguous_strides(shape), offset));
      offset += numel(shape);
    }
  }
  const Tensor& operator[](size_t i) const { return views_[i]; }
  void all_reduce(comm::Communicator& comm) const {
    if (buffer_.numel() > 0) comm.all_reduce(buffer_);
  }

 private:
  Tensor buffer_;
  std::vector<Tensor> views_;
};

// Point-to-point tags of a gather to one rank, apart from the pipeline's.
enum GatherTag : int { kPieceCount = 16, kPieceHeaders = 17, kPiece = 18 };

// A part of the full state that one rank owns: its tensor-parallel shard (rank `tp`, cut
// along `axis` in `parts` blocks; axis -1: the whole tensor) of full parameter `parameter`,
// or of that parameter's optimizer slot `slot` (-1: the weight itself).
struct Piece {
  int64_t parameter = 0, slot = -1, tp = 0, axis = -1, parts = 1;
  DType dtype = DType::f32;
  Tensor tensor = {};
};
constexpr int64_t kHeaderFields = 6;

// On `root`: every rank's pieces, root's own first, then rank by rank; `shape_of` gives a
// received piece's shape from its header. Elsewhere: this rank's pieces go to root, and
// none come back. Collective over `world`. Only root ever holds more than its own part.
std::vector<Piece> gather_pieces(comm::Communicator& world, int root, std::vector<Piece> own,
                                 const std::function<Shape(const Piece&)>& shape_of) {
  if (world.rank() != root) {
    const int64_t n = static_cast<int64_t>(own.size());
    world.send(Tensor::from_vector(std::vector<int64_t>{n}, {1}), root, kPieceCount);
    if (n == 0) return {};
    std::vector<int64_t> headers;
    for (const Piece& p : own) {
      headers.insert(headers.end(), {p.parameter, p.slot, p.tp, p.axis, p.parts, static_cast<int64_t>(p.dtype)});
    }
    world.send(Tensor::from_vector(headers, {n * kHeaderFields}), root, kPieceHeaders);
    for (const Piece& p : own) world.send(p.tensor, root, kPiece);
    return {};
  }
  std::vector<Piece> all = std::move(own);
  for (int r = 0; r < world.size(); ++r) {
    if (r == root) continue;
    const Tensor count = Tensor::empty({1}, DType::i64);
    world.recv(count, r, kPieceCount);
    const int64_t n = count.data<int64_t>()[0];
    if (n == 0) continue;
    const Tensor headers = Tensor::empty({n * kHeaderFields}, DType::i64);
    world.recv(headers, r, kPieceHeaders);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t* h = headers.data<int64_t>() + i * kHeaderFields;
      Piece p{
          .parameter = h[0], .slot = h[1], .tp = h[2], .axis = h[3], .parts = h[4], .dtype = static_cast<DType>(h[5])};
      p.tensor = Tensor::empty(shape_of(p), p.dtype);
      world.recv(p.tensor, r, kPiece);
      all.push_back(std::move(p));
    }
  }
  return all;
}

}  // namespace

bool GptMeshRank::owns(const ShardSpec& spec) const {
  const MeshCoord c = mesh_.coord();
  return c.dp == 0 && (spec.axis >= 0 || c.tp == 0);
}

Shape GptMeshRank::shard_shape(size_t parameter, int64_t axis) const {
  Shape shape = full_parameters_[parameter].second;
  if (axis >= 0) shape[static_cast<size_t>(axis)] /= mesh_.shape().tp;
  return shape;
}

NamedTensors GptMeshRank::unsharded_optimizer_state() {
  if (!sharded_) return optimizer_->state_dict();
  // Replica 0 owns the state the gathers take: its rank of the group assembles it.
  NamedTensors state = sharded_->full_state_dict(0);
  if (mesh_.coord().dp != 0) {
    for (const auto& [key, tensor] : sharded_->optimizer().state_dict())
      if (key == "step") state.emplace_back(key, tensor);
  }
  return state;
}

NamedTensors GptMeshRank::gather_full_weights_on(int root) {
  const std::vector<ShardSpec> specs = stage_->shard_specs();
  const std::vector<Tensor> local = stage_->parameters();
  std::vector<Piece> own;
  for (size_t i = 0; i < local.size(); ++i) {
    if (!owns(specs[i])) continue;
    own.push_back({.parameter = static_cast<int64_t>(full_index_[i]),
                   .tp = mesh_.coord().tp,
                   .axis = specs[i].axis,
                   .parts = specs[i].parts,
                   .tensor = local[i].detach().to(Device::cpu()).contiguous()});
  }
  const std::vector<Piece> pieces = gather_pieces(*mesh_.world(), root, std::move(own), [&](const Piece& p) {
    return shard_shape(static_cast<size_t>(p.parameter), p.axis);
  });
  if (mesh_.world()->rank() != root) return {};
  NoGradGuard no_grad;
  std::vector<Tensor> full;
  for (const auto& [name, shape] : full_parameters_) full.push_back(Tensor::empty(shape, DType::f32));
  std::vector<int64_t> placed(full.size(), 0);
  for (const Piece& p : pieces) {
    const auto f = static_cast<size_t>(p.parameter);
    place_shard(full[f], p.tensor, ShardSpec{.full_name = "", .axis = p.axis, .parts = p.parts}, static_cast<int>(p.tp),
                mesh_.shape().tp);
    placed[f] += p.tensor.numel();
  }
  NamedTensors out;
  for (size_t f = 0; f < full.size(); ++f) {
    LOCKSTEP_CHECK(placed[f] == full[f].numel())
        << "the mesh's ranks hold " << placed[f] << " of " << full_parameters_[f].first << "'s " << full[f].numel()
        << " elements";
    out.emplace_back(full_parameters_[f].first, full[f]);
  }
  return out;
}

NamedTensors GptMeshRank::gather_full_optimizer_state_on(int root) {
  const std::vector<ShardSpec> specs = stage_->shard_specs();
  const std::vector<optim::StateSlot>& slots = optimizer().slots();
  Tensor step;
  std::vector<Piece> own;
  for (const auto& [key, tensor] : unsharded_optimizer_state()) {
    size_t index = 0;
    std::string slot;
    if (!optim::parse_state_key(key, index, slot)) {
      step = tensor.to(Device::cpu()).clone();  // "step": the same on every rank
      continue;
    }
    if (!owns(specs[index])) continue;
    const size_t s = slot_index(slots, slot);
    if (!slots[s].per_element && mesh_.coord().tp != 0) continue;  // a counter: whole on every tensor-parallel rank
    own.push_back({.parameter = static_cast<int64_t>(full_index_[index]),
                   .slot = static_cast<int64_t>(s),
                   .tp = mesh_.coord().tp,
                   .axis = slots[s].per_element ? specs[index].axis : -1,
                   .parts = specs[index].parts,
                   .dtype = tensor.dtype(),
                   .tensor = tensor.to(Device::cpu()).contiguous()});
  }
  const std::vector<Piece> pieces = gather_pieces(*mesh_.world(), root, std::move(own), [&](const Piece& p) {
    return slots[static_cast<size_t>(p.slot)].per_element ? shard_shape(static_cast<size_t>(p.parameter), p.axis)
                                                          : Shape{};
  });
  if (mesh_.world()->rank() != root) return {};
  // (parameter, slot) -> the full entry; a slot no rank holds yet (no step taken) is left
  // out, as an unsharded optimizer leaves it out.
  std::map<std::pair<int64_t, int64_t>, Tensor> entries;
  for (const Piece& p : pieces) {
    const bool per_element = slots[static_cast<size_t>(p.slot)].per_element;
    Tensor& entry = entries[{p.parameter, p.slot}];
    if (!entry.defined()) {
      entry =
          per_element ? Tensor::empty(full_parameters_[static_cast<size_t>(p.parameter)].second, p.dtype) : p.tensor;
    }
    if (per_element) {
      place_shard(entry, p.tensor, ShardSpec{.full_name = "", .axis = p.axis, .parts = p.parts}, static_cast<int>(p.tp),
                  mesh_.shape().tp);
    }
  }
  NamedTensors full;
  if (step.defined()) full.emplace_back("step", step);
  for (const auto& [at, tensor] : entries) {
    full.emplace_back(optim::state_key(static_cast<size_t>(at.first), slots[static_cast<size_t>(at.second)].name),
                      tensor);
  }
  return full;
}

NamedTensors GptMeshRank::gather_full_weights() {
  const MeshCoord c = mesh_.coord();
  const std::vector<ShardSpec> specs = stage_->shard_specs();
  const std::vector<Tensor> local = stage_->parameters();
  std::vector<Shape> shapes;
  for (const auto& [name, shape] : full_parameters_) shapes.push_back(shape);
  const OwnersSum full(shapes, DType::f32);
  NoGradGuard no_grad;
  // Replica 0 owns the weights; a replicated tensor, its tensor-parallel rank 0.
  if (c.dp == 0) {
    for (size_t i = 0; i < local.size(); ++i) {
      if (specs[i].axis >= 0 || c.tp == 0)
        place_shard(full[full_index_[i]], local[i], specs[i], c.tp, mesh_.shape().tp);
    }
  }
  full.all_reduce(*mesh_.world());
  NamedTensors out;
  for (size_t f = 0; f < full_parameters_.size(); ++f) out.emplace_back(full_parameters_[f].first, full[f]);
  return out;
}

NamedTensors GptMeshRank::gather_full_optimizer_state() {
  const MeshCoord c = mesh_.coord();
  const std::vector<ShardSpec> specs = stage_->shard_specs();
  const std::vector<optim::StateSlot>& slots = optimizer().slots();
  // Every (parameter, slot) of the full model on every rank — per-element state in one
  // float buffer, counters in an integer one — with a count of the ranks that own each: a
  // slot no rank has yet (no step taken) is left out, as an unsharded optimizer leaves it out.
  struct Entry {
    size_t parameter, slot, index;  // index: in `values` or `counters`, by the slot's kind
  };
  std::vector<Entry> entries;
  std::vector<Shape> value_shapes, counter_shapes;
  for (size_t f = 0; f < full_parameters_.size(); ++f) {
    for (size_t s = 0; s < slots.size(); ++s) {
      std::vector<Shape>& shapes = slots[s].per_element ? value_shapes : counter_shapes;
      entries.push_back({f, s, shapes.size()});
      shapes.push_back(slots[s].per_element ? full_parameters_[f].second : Shape{});
    }
  }
  const OwnersSum values(value_shapes, DType::f32), counters(counter_shapes, DType::i64);
  const OwnersSum owners({Shape{static_cast<int64_t>(entries.size())}}, DType::i64);
  const auto place = [&](const Entry& entry) -> const Tensor& {
    return slots[entry.slot].per_element ? values[entry.index] : counters[entry.index];
  };
  Tensor step;
  for (const auto& [key, tensor] : unsharded_optimizer_state()) {
    size_t index = 0;
    std::string slot;
    if (!optim::parse_state_key(key, index, slot)) {
      step = tensor.to(Device::cpu()).clone();  // "step": the same on every rank
      continue;
    }
    if (c.dp != 0 || (specs[index].axis < 0 && c.tp != 0)) continue;
    const size_t s = slot_index(slots, slot);
    // A counter is whole on every tensor-parallel rank: one of them gives it, not the sum.
    if (!slots[s].per_element && c.tp != 0) continue;
    const size_t e = full_index_[index] * slots.size() + s;
    if (slots[s].per_element) {
      place_shard(place(entries[e]), tensor, specs[index], c.tp, mesh_.shape().tp);
    } else {
      place(entries[e]).copy_from(tensor);
    }
    owners[0].data<int64_t>()[e] = 1;
  }
  comm::Communicator& world = *mesh_.world();
  owners.all_reduce(world);
  values.all_reduce(world);
  counters.all_reduce(world);
  NamedTensors full;
  if (step.defined()) full.emplace_back("step", step);
  for (size_t e = 0; e < entries.size(); ++e) {
    if (owners[0].data<int64_t>()[e] == 0) continue;
    full.emplace_back(optim::state_key(entries[e].parameter, slots[entries[e].slot].name), place(entries[e]));
  }
  return full;
}

void GptMeshRank::load_full_weights(const NamedTensors& weights) {
  const int tp_rank = mesh_.coord().tp, tp_size = mesh_.shape().tp;
  const std::vector<ShardSpec> specs = stage_->shard_specs();
  const auto full_tensor = [&](const std::string& name) -> const Tensor& {
    for (const auto& [key, tensor] : weights)
      if (key == name) return tensor;
    LOCKSTEP_FAIL() << "the full model's weights have no " << name;
    std::abort();  // unreachable: the line above throws
  };
  NoGradGuard no_grad;
  const std::vector<Tensor> local = stage_->parameters();
  for (size_t i = 0; i < local.size(); ++i) {
    local[i].copy_from(shard_of(full_tensor(specs[i].full_name), specs[i], tp_rank, tp_size));
  }
  if (stage_->last() && !stage_->first()) {
    stage_->head_weight.copy_from(shard_of(full_tensor("wte.weight"), ShardSpec{"wte.weight", 0}, tp_rank, tp_size));
  }
}

void GptMeshRank::load_full_optimizer_state(const NamedTensors& optimizer_state) {
  const int tp_rank = mesh_.coord().tp, tp_size = mesh_.shape().tp;
  const std::vector<ShardSpec> specs = stage_->shard_specs();
  // Full parameter index -> this rank's.
  std::map<size_t, size_t> local_index;
  for (size_t j = 0; j < full_index_.size(); ++j) local_index[full_index_[j]] = j;
  NamedTensors state;
  for (const auto& [key, tensor] : optimizer_state) {
    size_t index = 0;
    std::string slot;
    if (!optim::parse_state_key(key, index, slot)) {
      state.emplace_back(key, tensor);
      continue;
    }
    const auto it = local_index.find(index);
    if (it == local_index.end()) continue;  // another stage's parameter
    const std::vector<optim::StateSlot>& slots = optimizer().slots();
    const size_t s = slot_index(slots, slot);  // an unknown slot: load_state_dict names it
    const bool per_element = s < slots.size() && slots[s].per_element;
    state.emplace_back(optim::state_key(it->second, slot),
                       per_element ? shard_of(tensor, specs[it->second], tp_rank, tp_size) : tensor);
  }
  // Under ZeRO-1, this rank's parts of the unsharded state of its parameters.
  if (sharded_) {
    sharded_->load_full_state_dict(state);
  } else {
    optimizer_->load_state_dict(state);
  }
}

}  // namespace lockstep::parallel
