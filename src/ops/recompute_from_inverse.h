#pragma once
// The ATen coupling that keeps no activations: it saves only the coupling's
// outputs, and its backward rebuilds the inputs with the exact inverse and
// differentiates the map again from there. For invertible kinds only.
#include <ATen/core/Tensor.h>

#include <utility>

namespace cqk {

class QKCouplingImpl;

namespace ops {

std::pair<at::Tensor, at::Tensor> recompute_from_inverse(QKCouplingImpl& coupling, const at::Tensor& q,
                                                         const at::Tensor& k);

}  // namespace ops
}  // namespace cqk
