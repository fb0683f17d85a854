#include "cqk/swiglu.h"

#include <ATen/ATen.h>

#include "ops/swiglu_kernel.h"

namespace cqk {

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  if (!ops::swiglu_kernel_applies(gate, up)) return at::silu(gate) * up;
  return ops::swiglu_kernel(gate, up);
}

}  // namespace cqk
