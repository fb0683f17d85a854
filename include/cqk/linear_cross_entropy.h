#pragma once
// The output head and its loss in one autograd function: mean cross entropy of
// the logits hidden @ weight^T against targets, without keeping the logits.
#include <ATen/core/Tensor.h>

#include "cqk/ignored_target.h"

namespace cqk {

// hidden [N, d], weight [V, d], targets [N] int64 in [0, V) or ignore_index.
// Returns the mean over targets != ignore_index (NaN when there are none, as
// at::cross_entropy_loss). The value and gradients are those of
// cross_entropy(hidden @ weight^T, targets); the difference is the work: the
// forward turns the float32 logits in place into their gradient
// (softmax - one_hot, which it keeps for the backward) instead of keeping a
// log-softmax, so there is no log-softmax backward and no [N, V] zero fill,
// and the backward's two matmuls apply the scale to their small outputs.
// Under autocast the matmuls run in the autocast type and the softmax in float32.
at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                int64_t ignore_index = kIgnoredTarget);

}  // namespace cqk
