// A loss is the user's function of (model, micro-batch, step context). Every layout calls it
// once per micro-batch of the step's tree, on the device that runs that micro-batch, after
// setting the context on the model (so Dropout and other random layers key their draws by
// global sample index).
//
// The contract: the function returns ONE LOSS PER SAMPLE — a floating tensor whose first
// axis has micro_batch.size() entries, [n] or [n, ...] (further axes are terms of one
// sample, e.g. the positions of a sequence; each sample's loss is their mean). The layout
// averages over the *global* batch: every element is weighted 1 / (global batch × terms per
// sample), so a micro-batch counts the same whichever device, process or accumulation step
// carries it, and the step is the mean loss of the global batch on any layout. A mean or a
// sum over the micro-batch (a 0-d tensor, or the wrong first axis) is refused with an error:
// it would silently weight micro-batches by the device count. Auxiliary terms are added per
// sample (loss = main + 0.1 * aux, both [n]).
#pragma once

#include <functional>
#include <string>

#include "lockstep/data/tensor_batch.h"
#include "lockstep/nn/module.h"

namespace lockstep::parallel {

// What a loss function knows about the micro-batch it is given: the run's seed, the
// optimizer step, and the global index of the micro-batch's first sample.
using StepContext = nn::ForwardContext;

using LossFunction =
    std::function<Tensor(nn::Module& model, const TensorBatch& micro_batch, const StepContext& context)>;

// Classification: model(batch[input]) gives logits [n, classes]; batch[target] holds class
// indices [n] (i64 or i32). Per-sample cross-entropy, as torch.nn.CrossEntropyLoss's mean.
// label_smoothing ε in [0, 1] as CrossEntropyLoss(label_smoothing=ε): the target is
// (1 - ε) on the class and ε / classes on every class, so each sample's loss is
// (1 - ε) · (-log p_target) + ε · mean over classes of (-log p_c).
LossFunction classification_loss(std::string input = "input", std::string target = "target",
                                 double label_smoothing = 0.0);

// Sequence models: model(batch[input]) gives logits [n, T, vocab] for targets [n, T] (the
// next token at every position). Each position's cross-entropy; the step's loss is the mean
// over every position of the global batch.
LossFunction next_token_loss(std::string input = "input", std::string target = "target");

// Regression: model(batch[input]) and batch[target] have one shape [n, ...]; the squared
// error of each element, so the step's loss is torch.nn.MSELoss's mean over the global batch.
LossFunction mse_loss(std::string input = "input", std::string target = "target");

// A pipeline's loss, on its last stage: per-sample losses (the contract above) of the
// model's output for the micro-batch (the batch's other fields: targets, weights, ...).
using OutputLoss =
    std::function<Tensor(const Tensor& output, const TensorBatch& micro_batch, const StepContext& context)>;

// The shipped losses of an output, for pipelines: cross-entropy of logits [n, ..., classes]
// against class indices batch[target] [n, ...] (label smoothing as classification_loss's);
// the squared error against batch[target] of
// the output's shape.
OutputLoss cross_entropy_loss_of(std::string target, double label_smoothing = 0.0);
OutputLoss squared_error_of(std::string target);

// Checks what a loss function returned for a micro-batch of `samples` samples (the contract
// above) and returns its terms per sample; the Error says what was returned and what to do.
int64_t check_per_sample_loss(const Tensor& loss, int64_t samples);

}  // namespace lockstep::parallel
