#include "lockstep/parallel/loss_function.h"

#include "lockstep/ops/ops.h"

namespace lockstep::parallel {
namespace {

// Cross-entropy of logits [n, ..., classes] against targets [n, ...], one loss per target.
Tensor cross_entropy_per_target(const Tensor& logits, const Tensor& targets, const char* loss_name) {
  LOCKSTEP_CHECK(logits.dim() == targets.dim() + 1)
      << loss_name << ": the model gave logits " << shape_str(logits.shape()) << " for targets "
      << shape_str(targets.shape()) << "; logits need one more axis than the targets (the classes, last)";
  for (int64_t axis = 0; axis < targets.dim(); ++axis) {
    LOCKSTEP_CHECK(logits.size(axis) == targets.size(axis))
        << loss_name << ": logits " << shape_str(logits.shape()) << " do not match targets "
        << shape_str(targets.shape()) << " on axis " << axis;
  }
  const Tensor losses = cross_entropy(flatten(logits, 0, -2), flatten(targets, 0), Reduction::none);
  return reshape(losses, targets.shape());
}

void check_label_smoothing(double label_smoothing, const char* loss_name) {
  LOCKSTEP_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0)
      << loss_name << ": label_smoothing must lie in [0, 1] (0: none; PyTorch's recipes use 0.1), got "
      << label_smoothing;
}

// With label smoothing ε: (1 - ε) times the cross-entropy plus ε times the mean over the
// classes of -log p (the cross-entropy against the uniform distribution).
Tensor smoothed_cross_entropy(const Tensor& logits, const Tensor& targets, double label_smoothing,
                              const char* loss_name) {
  const Tensor losses = cross_entropy_per_target(logits, targets, loss_name);
  if (label_smoothing == 0.0) return losses;
  const Tensor uniform = neg(mean(log_softmax(logits, -1), {-1}));
  return losses * (1.0 - label_smoothing) + uniform * label_smoothing;
}

// The squared error of each element of a prediction against targets of its shape.
Tensor squared_error(const Tensor& prediction, const Tensor& wanted, const std::string& target, const char* loss_name) {
  LOCKSTEP_CHECK(prediction.shape() == wanted.shape())
      << loss_name << ": the model gave " << shape_str(prediction.shape()) << " for targets '" << target << "' "
      << shape_str(wanted.shape()) << "; they must have one shape (reshape the targets, e.g. [n] to [n, 1])";
  return square(prediction - wanted.to(prediction.dtype()));
}

}  // namespace

LossFunction classification_loss(std::string input, std::string target, double label_smoothing) {
  check_label_smoothing(label_smoothing, "classification_loss");
  return [input = std::move(input), target = std::move(target), label_smoothing](
             nn::Module& model, const TensorBatch& batch, const StepContext&) {
    const Tensor& labels = batch.at(target);
    LOCKSTEP_CHECK(labels.dim() == 1) << "classification_loss: targets '" << target << "' are "
                                      << shape_str(labels.shape())
                                      << "; they must be one class index per sample, [n] (for sequences use "
                                         "next_token_loss)";
    return smoothed_cross_entropy(model(batch.at(input)), labels, label_smoothing, "classification_loss");
  };
}

LossFunction next_token_loss(std::string input, std::string target) {
  return [input = std::move(input), target = std::move(target)](nn::Module& model, const TensorBatch& batch,
                                                                const StepContext&) {
    const Tensor& targets = batch.at(target);
    LOCKSTEP_CHECK(targets.dim() == 2) << "next_token_loss: targets '" << target << "' are "
                                       << shape_str(targets.shape()) << "; they must be one token per position, [n, T]";
    return cross_entropy_per_target(model(batch.at(input)), targets, "next_token_loss");
  };
}

LossFunction mse_loss(std::string input, std::string target) {
  return [input = std::move(input), target = std::move(target)](nn::Module& model, const TensorBatch& batch,
                                                                const StepContext&) {
    return squared_error(model(batch.at(input)), batch.at(target), target, "mse_loss");
  };
}

OutputLoss cross_entropy_loss_of(std::string target, double label_smoothing) {
  check_label_smoothing(label_smoothing, "cross_entropy_loss_of");
  return [target = std::move(target), label_smoothing](const Tensor& logits, const TensorBatch& batch,
                                                       const StepContext&) {
    return smoothed_cross_entropy(logits, batch.at(target), label_smoothing, "cross_entropy_loss_of");
  };
}

OutputLoss squared_error_of(std::string target) {
  return [target = std::move(target)](const Tensor& prediction, const TensorBatch& batch, const StepContext&) {
    return squared_error(prediction, batch.at(target), target, "squared_error_of");
  };
}

int64_t check_per_sample_loss(const Tensor& loss, int64_t samples) {
  LOCKSTEP_CHECK(loss.defined()) << "the loss function returned no tensor: return one loss per sample";
  LOCKSTEP_CHECK(loss.dim() >= 1 && loss.size(0) == samples)
      << "the loss function returned a tensor of shape " << shape_str(loss.shape()) << " for a micro-batch of "
      << samples << " samples: return one loss per sample (shape [" << samples
      << ", ...], e.g. cross_entropy with Reduction::none), not their mean or sum: the layout averages over the "
         "global batch, so that the step does not depend on how many devices carry it";
  LOCKSTEP_CHECK(is_floating(loss.dtype()))
      << "the loss function returned " << dtype_name(loss.dtype()) << " losses: they must be floating point";
  LOCKSTEP_CHECK(loss.requires_grad())
      << "the loss function returned losses that do not depend on the model's parameters (no gradient would "
         "flow): compute them from the model's output";
  return samples == 0 ? 1 : loss.numel() / samples;
}

}  // namespace lockstep::parallel
