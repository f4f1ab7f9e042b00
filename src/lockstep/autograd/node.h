// The autograd graph. A differentiable op records a Node that knows how to turn gradients
// of its outputs into gradients of its inputs; edges lead to the nodes that produced those
// inputs, ending at leaves (parameters), whose AccumulateGrad nodes add into .grad.
//
// Ops record with autograd::record(name, inputs, outputs, backward_fn). The backward
// function must capture what it needs by value, detached (t.detach()) for outputs, so the
// graph holds no cycles; its captures are freed as soon as it has run.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <vector>

#include "lockstep/autograd/grad_mode.h"
#include "lockstep/core/tensor.h"

namespace lockstep::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> node;  // null: that input needs no gradient
  uint32_t input_nr = 0;       // which of node's outputs this edge feeds
};

// Shape, dtype and device of a tensor, kept without its bytes to check and make gradients.
struct TensorMeta {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
  explicit TensorMeta(const Tensor& t) : shape(t.shape()), dtype(t.dtype()), device(t.device()) {}
};

class Node {
 public:
  virtual ~Node() = default;
  // One gradient per forward output (zeros where an output got none); returns one per
  // forward input (undefined where that input needs none).
  virtual std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) = 0;
  // Frees saved tensors once the node has run.
  virtual void release() {}
  virtual const char* name() const = 0;

  std::vector<Edge> next_edges;         // one per forward input
  std::vector<TensorMeta> input_meta;   // one per forward input
  std::vector<TensorMeta> output_meta;  // one per forward output
};

using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

// True when grad mode is on and any of the tensors requires grad: the op must record.
bool needs_grad(std::initializer_list<Tensor> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

// Records outputs as made from inputs by the op `name` (a string literal), whose backward
// is `backward`. Does nothing unless needs_grad(inputs). Undefined inputs are allowed
// (optional arguments such as a missing bias) and get no gradient.
void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            BackwardFn backward);

// The edge along which a gradient for `t` must flow (its grad_fn, or its leaf accumulator).
Edge gradient_edge(const Tensor& t);

// A parameter as an op's backward sees it: the leaf itself when `t` is a leaf, else
// nothing (held weakly, so a saved parameter never keeps a graph alive).
std::weak_ptr<TensorImpl> leaf_of(const Tensor& t);
// The tensor an op's backward should compute the gradient of `leaf` into: the leaf's
// grad destination when it has one that fits (and no grad yet), else a new tensor.
Tensor gradient_output(const std::weak_ptr<TensorImpl>& leaf, const Shape& shape, DType dtype, Device device);

}  // namespace lockstep::autograd
