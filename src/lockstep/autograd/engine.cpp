// Runs backward over the graph recorded by ops: a topological order from the root, one
// gradient buffer per node output summed as gradients arrive, each node applied once after
// all its consumers, then released so saved activations go as soon as they are used.
#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "lockstep/autograd/node.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/autograd/cuda/add_kernels.h"
#include "lockstep/core/cuda/runtime.h"
#endif

namespace lockstep {

namespace {
thread_local bool tls_grad_enabled = true;
}

bool GradMode::enabled() { return tls_grad_enabled; }
void GradMode::set_enabled(bool enabled) { tls_grad_enabled = enabled; }

namespace autograd {
namespace {

// dst += src, elementwise, for same-shape tensors (gradient sums). dst is contiguous and
// owned by the engine or a leaf's .grad.
void add_into(const Tensor& dst, const Tensor& src) {
  LOCKSTEP_CHECK(dst.shape() == src.shape())
      << "gradient of shape " << shape_str(src.shape()) << " cannot accumulate into " << shape_str(dst.shape());
  const Tensor s =
      same_memory(src.device(), dst.device()) && src.dtype() == dst.dtype() && src.is_contiguous() ? src : [&] {
        Tensor t = Tensor::empty(dst.shape(), dst.dtype(), dst.device());
        t.copy_from(src);
        return t;
      }();
  const int64_t n = dst.numel();
#if LOCKSTEP_HAVE_CUDA
  if (dst.device().is_cuda()) {
    lockstep::cuda::OnDevice on(dst.device());
    LOCKSTEP_CHECK(cuda::add_elements(dst.data_ptr(), s.data_ptr(), dst.data_ptr(), n, dst.dtype(), on.stream()))
        << "gradients of dtype " << dtype_name(dst.dtype()) << " are not supported (use f32 or f64)";
    return;
  }
#endif
  if (dst.dtype() == DType::f32) {
    float* d = dst.data<float>();
    const float* p = s.data<float>();
    for (int64_t i = 0; i < n; ++i) d[i] += p[i];
  } else if (dst.dtype() == DType::f64) {
    double* d = dst.data<double>();
    const double* p = s.data<double>();
    for (int64_t i = 0; i < n; ++i) d[i] += p[i];
  } else {
    LOCKSTEP_FAIL() << "gradients of dtype " << dtype_name(dst.dtype()) << " are not supported (use f32 or f64)";
  }
}

// A fresh contiguous copy: gradient buffers are written in place, so they never alias a
// tensor that some node returned (which may be saved elsewhere or be a view).
Tensor owned_copy(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), t.dtype(), t.device());
  out.copy_from(t);
  return out;
}

class FunctionNode final : public Node {
 public:
  FunctionNode(const char* name, BackwardFn fn) : name_(name), fn_(std::move(fn)) {}
  std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) override {
    LOCKSTEP_CHECK(fn_ != nullptr) << "backward through " << name_
                                   << " a second time: its saved tensors were freed after the first backward";
    return fn_(grad_outputs);
  }
  void release() override { fn_ = nullptr; }
  const char* name() const override { return name_; }

 private:
  const char* name_;
  BackwardFn fn_;
};

// Adds the incoming gradient into the leaf's .grad (allocating it the first time).
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) override {
    const Tensor& g = grad_outputs[0];
    // The pass has reached the leaf: a destination is for one pass only.
    const std::shared_ptr<TensorImpl> destination = std::move(leaf_->grad_destination);  // leaves it null
    leaf_->grad_destination_given = false;
    if (leaf_->grad == nullptr && destination && g.impl_ptr() == destination) {
      leaf_->grad = destination;  // the op computed it in place
    } else if (leaf_->grad == nullptr) {
      // Steal the buffer when nothing else holds it (the usual case), else copy it; later
      // micro-steps add into it.
      const bool sole_owner = g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && g.is_contiguous() &&
                              g.dtype() == leaf_->dtype;
      leaf_->grad = (sole_owner ? g.detach() : owned_copy(g)).impl_ptr();
    } else {
      add_into(Tensor(leaf_->grad), g);
    }
    // The engine runs this node once, with every contribution summed: the grad is final.
    if (const auto hook = leaf_->post_accumulate_grad_hook) (*hook)();
    return {};
  }
  const char* name() const override { return "AccumulateGrad"; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

}  // namespace

bool needs_grad(std::initializer_list<Tensor> inputs) {
  if (!GradMode::enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!GradMode::enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  TensorImpl* impl = t.impl();
  if (impl->grad_fn) return {impl->grad_fn, impl->output_nr};
  std::shared_ptr<Node> accumulator = impl->grad_accumulator.lock();
  if (!accumulator) {
    auto node = std::make_shared<AccumulateGrad>(t.impl_ptr());
    node->input_meta.emplace_back(t);
    node->output_meta.emplace_back(t);
    accumulator = node;
    impl->grad_accumulator = accumulator;
  }
  return {accumulator, 0};
}

std::weak_ptr<TensorImpl> leaf_of(const Tensor& t) {
  if (!t.defined() || !t.is_leaf()) return {};
  return t.impl_ptr();
}

Tensor gradient_output(const std::weak_ptr<TensorImpl>& leaf, const Shape& shape, DType dtype, Device device) {
  const std::shared_ptr<TensorImpl> impl = leaf.lock();
  if (impl && impl->grad == nullptr && impl->grad_destination && !impl->grad_destination_given) {
    const Tensor destination(impl->grad_destination);
    if (destination.shape() == shape && destination.dtype() == dtype && destination.device() == device) {
      impl->grad_destination_given = true;
      return destination;
    }
  }
  return Tensor::empty(shape, dtype, device);
}

void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            BackwardFn backward) {
  if (!needs_grad(inputs)) return;
  auto node = std::make_shared<FunctionNode>(name, std::move(backward));
  for (const Tensor& input : inputs) {
    node->next_edges.push_back(gradient_edge(input));
    node->input_meta.emplace_back(input.defined() ? input : Tensor::empty({}));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    TensorImpl* out = outputs[i].impl();
    out->requires_grad = true;
    out->grad_fn = node;
    out->output_nr = static_cast<uint32_t>(i);
    node->output_meta.emplace_back(outputs[i]);
  }
}

}  // namespace autograd

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  LOCKSTEP_CHECK(is_leaf() || requires_grad)
      << "set_requires_grad(false) on a tensor computed by an op: use detach() to cut it from the graph";
  LOCKSTEP_CHECK(!requires_grad || is_floating(dtype()))
      << "only floating-point tensors can require grad, this one is " << dtype_name(dtype());
  impl()->requires_grad = requires_grad;
  return *this;
}

void Tensor::set_grad_destination(const Tensor& view) const {
  LOCKSTEP_CHECK(is_leaf()) << "a grad destination goes on a leaf (a parameter), not on an op's result";
  if (view.defined()) {
    LOCKSTEP_CHECK(view.shape() == shape() && view.dtype() == dtype() && view.device() == device() &&
                   view.is_contiguous())
        << "a grad destination must be a contiguous " << shape_str(shape()) << " " << dtype_name(dtype()) << " on "
        << device().str() << ", like its leaf; got " << (view.is_contiguous() ? "" : "non-contiguous ")
        << shape_str(view.shape()) << " " << dtype_name(view.dtype()) << " on " << view.device().str();
  }
  impl()->grad_destination = view.defined() ? view.impl_ptr() : nullptr;
  impl()->grad_destination_given = false;
}

void Tensor::set_post_accumulate_grad_hook(std::function<void()> hook) const {
  LOCKSTEP_CHECK(is_leaf()) << "a post-accumulate-grad hook goes on a leaf (a parameter), not on an op's result";
  impl()->post_accumulate_grad_hook = hook ? std::make_shared<const std::function<void()>>(std::move(hook)) : nullptr;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = storage();
  impl->offset = offset();
  impl->shape = shape();
  impl->strides = strides();
  impl->dtype = dtype();
  return Tensor(std::move(impl));
}

void Tensor::backward(const Tensor& gradient) const {
  using autograd::Node;
  LOCKSTEP_CHECK(requires_grad())
      << "backward() on a tensor that does not require grad: it was computed under NoGradGuard or from "
         "tensors none of which require grad (call set_requires_grad(true) on the parameters)";
  Tensor seed = gradient;
  if (!seed.defined()) {
    LOCKSTEP_CHECK(numel() == 1)
        << "backward() without a gradient needs a one-element tensor (a loss), this one has shape "
        << shape_str(shape()) << ": reduce it first (sum or mean) or pass a gradient";
    seed = Tensor::ones(shape(), dtype(), device());
  }
  LOCKSTEP_CHECK(seed.shape() == shape()) << "backward(): gradient of shape " << shape_str(seed.shape())
                                          << " does not match tensor of shape " << shape_str(shape());

  NoGradGuard no_grad;
  const autograd::Edge root = autograd::gradient_edge(*this);

  // Topological order (reverse DFS post-order) and, per node, one buffer per output.
  std::vector<Node*> order;
  std::unordered_set<Node*> seen;
  std::vector<std::pair<Node*, size_t>> stack{{root.node.get(), 0}};
  seen.insert(root.node.get());
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    if (next < node->next_edges.size()) {
      Node* child = node->next_edges[next++].node.get();
      if (child != nullptr && seen.insert(child).second) stack.emplace_back(child, 0);
    } else {
      order.push_back(node);
      stack.pop_back();
    }
  }
  std::reverse(order.begin(), order.end());

  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  buffers[root.node.get()].resize(root.node->output_meta.size());
  buffers[root.node.get()][root.input_nr] = autograd::owned_copy(seed);

  for (Node* node : order) {
    std::vector<Tensor> grads = std::move(buffers[node]);
    buffers.erase(node);
    grads.resize(node->output_meta.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) {
        const auto& meta = node->output_meta[i];
        grads[i] = Tensor::zeros(meta.shape, meta.dtype, meta.device);
      }
    }
    std::vector<Tensor> input_grads = node->apply(grads);
    grads.clear();
    node->release();
    for (size_t i = 0; i < input_grads.size() && i < node->next_edges.size(); ++i) {
      const autograd::Edge& edge = node->next_edges[i];
      Tensor& g = input_grads[i];
      if (edge.node == nullptr || !g.defined()) continue;
      LOCKSTEP_CHECK(g.shape() == node->input_meta[i].shape)
          << "internal error: " << node->name() << " returned a gradient of shape " << shape_str(g.shape())
          << " for input " << i << " of shape " << shape_str(node->input_meta[i].shape);
      auto& slot = buffers[edge.node.get()];
      slot.resize(edge.node->output_meta.size());
      Tensor& acc = slot[edge.input_nr];
      if (!acc.defined()) {
        acc = g;
      } else {
        if (acc.is_same(g) || !acc.is_contiguous() || acc.storage().use_count() > 1 || acc.impl_ptr().use_count() > 1)
          acc = autograd::owned_copy(acc);
        autograd::add_into(acc, g);
      }
    }
  }
}

}  // namespace lockstep
