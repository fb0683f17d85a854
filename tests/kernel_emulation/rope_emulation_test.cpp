// kernels/rope_kernels.cu (the base model's RoPE on CUDA) run on the CPU by the
// emulator against reference.h's float64 rotate-half RoPE, into outputs
// poisoned with NaN, on contiguous and strided inputs in both element types;
// and the inverse rotation (the backward) undoing the forward.
#include <gtest/gtest.h>

#include <ostream>
#include <tuple>

#include "emulator.h"
#include "reference.h"
#include "rope_kernels.h"
#include "test_support.h"
#include "tools/check_support.h"

namespace cqk::emulation {
namespace {

using fused_check::poisoned;

struct RopeCase {
  const char* name;
  int64_t batch, heads, time, head_dim;
  bool strided;  // x as a transposed view of [batch, time, heads, head_dim]
  at::ScalarType dtype;
};

std::ostream& operator<<(std::ostream& os, const RopeCase& c) { return os << c.name; }

at::Tensor random_input(const RopeCase& c) {
  if (c.strided) return at::randn({c.batch, c.time, c.heads, c.head_dim}).to(c.dtype).transpose(1, 2);
  return at::randn({c.batch, c.heads, c.time, c.head_dim}).to(c.dtype);
}

at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool inverse) {
  auto y = poisoned(x);
  const kernels::CouplingShape shape{x.size(0), x.size(1), x.size(2), x.size(3), 0};
  kernels::rope_rotate_cuda(element_type(x), shape, x.data_ptr(), row_strides(x), cos.data_ptr<float>(),
                            sin.data_ptr<float>(), inverse, y.data_ptr(), nullptr);
  return y;
}

class EmulatedRope : public ::testing::TestWithParam<std::tuple<RopeCase, RunOrder>> {};

TEST_P(EmulatedRope, MatchesFloat64AndTheInverseUndoesIt) {
  const auto& [c, order] = GetParam();
  const ScopedRunOrder run_order(order);
  at::manual_seed(13);
  const auto x = random_input(c);
  const auto [cos, sin] = rope_tables(c.time, c.head_dim);
  const auto y = rotate(x, cos, sin, /*inverse=*/false);
  // float32: the rotation's two products and a sum (measured ~1e-7);
  // bf16: one rounding of the output (2^-8 relative).
  const bool bf16 = c.dtype == at::kBFloat16;
  expect_close(y, reference_rope(x.to(at::kDouble), cos.to(at::kDouble), sin.to(at::kDouble)), bf16 ? 8e-3 : 1e-6,
               "rope(x)");
  expect_close(rotate(y, cos, sin, /*inverse=*/true), x, bf16 ? 1.6e-2 : 2e-6, "rope^-1(rope(x))");
}

INSTANTIATE_TEST_SUITE_P(Cases, EmulatedRope,
                         ::testing::Combine(::testing::Values(RopeCase{"fp32_D64", 2, 3, 17, 64, false, at::kFloat},
                                                              RopeCase{"fp32_D128_strided", 1, 2, 9, 128, true,
                                                                       at::kFloat},
                                                              RopeCase{"bf16_D64_strided", 2, 2, 33, 64, true,
                                                                       at::kBFloat16},
                                                              RopeCase{"fp32_D8_one_token", 1, 1, 1, 8, false,
                                                                       at::kFloat}),
                                            both_run_orders()),
                         case_and_order_name<RopeCase>);

TEST(EmulatedRope, RejectsAnOddHeadDim) {
  const kernels::CouplingShape shape{1, 1, 2, 7, 0};
  float x[14] = {}, y[14] = {}, table[6] = {};
  EXPECT_THROW(kernels::rope_rotate_cuda(kernels::ElementType::Float32, shape, x, kernels::RowStrides::contiguous(shape),
                                         table, table, false, y, nullptr),
               std::invalid_argument);
}

}  // namespace
}  // namespace cqk::emulation
