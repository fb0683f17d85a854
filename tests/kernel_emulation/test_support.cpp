#include "test_support.h"

#include "tools/tensor_compare.h"

namespace cqk::emulation {

kernels::AffineCouplingParams params_of(const CouplingWeights& w, bool shared_across_heads, float clamp) {
  kernels::AffineCouplingParams p{};
  p.num_steps = w.steps();
  p.shared_across_heads = shared_across_heads;
  p.clamp = clamp;
  for (int i = 0; i < w.steps(); ++i) {
    p.w1[i] = w.w1[i].data_ptr<float>();
    p.b1[i] = w.b1[i].data_ptr<float>();
    p.w2[i] = w.w2[i].data_ptr<float>();
    p.b2[i] = w.b2[i].data_ptr<float>();
  }
  return p;
}

kernels::AffineCouplingGrads grads_of(CouplingWeights& g) {
  kernels::AffineCouplingGrads out{};
  for (int i = 0; i < g.steps(); ++i) {
    out.w1[i] = g.w1[i].data_ptr<float>();
    out.b1[i] = g.b1[i].data_ptr<float>();
    out.w2[i] = g.w2[i].data_ptr<float>();
    out.b2[i] = g.b2[i].data_ptr<float>();
  }
  return out;
}

kernels::RowStrides row_strides(const at::Tensor& x) { return {x.stride(0), x.stride(1), x.stride(2)}; }

kernels::ElementType element_type(const at::Tensor& x) {
  return x.scalar_type() == at::kBFloat16 ? kernels::ElementType::BFloat16 : kernels::ElementType::Float32;
}

void expect_close(const at::Tensor& actual, const at::Tensor& expected, double tolerance, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const at::Tensor a = actual.to(at::kDouble), e = expected.detach().to(at::kDouble);
  const int64_t bad = (~at::isfinite(a)).sum().item<int64_t>();
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << a.numel() << " elements are not finite (unwritten?)";
  if (bad) return;
  const double error = cqk::testing::max_relative_error(a, e, /*floor=*/1e-2);
  EXPECT_LE(error, tolerance) << what << ": max |error| / max(max |expected|, 1e-2) is " << error;
}

}  // namespace cqk::emulation
