#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <sstream>
#include <vector>

#include "cqk/fused_adamw.h"

// FusedAdamW against torch::optim::AdamW: the same updates step by step (two
// groups, one with weight decay, a learning-rate change, a parameter without a
// gradient), and each one's state loading into the other.
namespace {

struct Setup {
  std::vector<at::Tensor> decayed, plain;
};

Setup parameters() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  Setup s;
  s.decayed = {at::randn({7, 5}, gen), at::randn({3, 4, 2}, gen)};
  s.plain = {at::randn({5}, gen), at::randn({6}, gen)};
  for (auto* list : {&s.decayed, &s.plain})
    for (auto& p : *list) p.requires_grad_(true);
  return s;
}

Setup copy(const Setup& s) {
  Setup c;
  for (const auto& p : s.decayed) c.decayed.push_back(p.detach().clone().requires_grad_(true));
  for (const auto& p : s.plain) c.plain.push_back(p.detach().clone().requires_grad_(true));
  return c;
}

template <typename Optimizer>
std::unique_ptr<Optimizer> make(Setup& s) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(s.decayed, std::make_unique<torch::optim::AdamWOptions>(
                                     torch::optim::AdamWOptions(3e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1)));
  groups.emplace_back(s.plain, std::make_unique<torch::optim::AdamWOptions>(
                                   torch::optim::AdamWOptions(3e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.0)));
  return std::make_unique<Optimizer>(groups, torch::optim::AdamWOptions(3e-2));
}

// The same gradients for both: a function of the step, the parameter's index and its values.
void set_gradients(Setup& s, int step, bool skip_last_plain) {
  int index = 0;
  for (auto* list : {&s.decayed, &s.plain}) {
    for (auto& p : *list) {
      ++index;
      if (skip_last_plain && list == &s.plain && &p == &list->back()) {
        p.mutable_grad() = at::Tensor();
        continue;
      }
      p.mutable_grad() = (at::sin(p.detach() * (index + 1) + step) + 0.01 * step).contiguous();
    }
  }
}

void expect_same(const Setup& a, const Setup& b) {
  for (size_t i = 0; i < a.decayed.size(); ++i)
    EXPECT_TRUE(at::allclose(a.decayed[i], b.decayed[i], 1e-6, 1e-7)) << "decayed " << i;
  for (size_t i = 0; i < a.plain.size(); ++i)
    EXPECT_TRUE(at::allclose(a.plain[i], b.plain[i], 1e-6, 1e-7)) << "plain " << i;
}

void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace

TEST(FusedAdamW, TakesTheSameStepsAsTorchAdamW) {
  auto fused_params = parameters(), reference_params = copy(fused_params);
  auto fused = make<cqk::FusedAdamW>(fused_params);
  auto reference = make<torch::optim::AdamW>(reference_params);
  for (int step = 0; step < 8; ++step) {
    if (step == 4) {
      set_lr(*fused, 1e-2);
      set_lr(*reference, 1e-2);
    }
    // Steps 2 and 3 leave one parameter without a gradient: it must not move, and its count must not advance.
    const bool skip = step == 2 || step == 3;
    set_gradients(fused_params, step, skip);
    set_gradients(reference_params, step, skip);
    fused->step();
    reference->step();
  }
  expect_same(fused_params, reference_params);
  // The parameters did move (a no-op step would also "agree").
  EXPECT_FALSE(at::allclose(fused_params.decayed[0], parameters().decayed[0]));
  const auto& state = static_cast<torch::optim::AdamWParamState&>(
      *fused->state().at(fused_params.plain.back().unsafeGetTensorImpl()));
  EXPECT_EQ(state.step(), 6);
}

TEST(FusedAdamW, StateLoadsIntoTorchAdamWAndBack) {
  auto fused_params = parameters();
  auto fused = make<cqk::FusedAdamW>(fused_params);
  for (int step = 0; step < 3; ++step) {
    set_gradients(fused_params, step, false);
    fused->step();
  }
  // Resume the fused run in a reference optimizer, and a copy of it in a fresh fused one.
  torch::serialize::OutputArchive out;
  fused->save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  auto reference_params = copy(fused_params), resumed_params = copy(fused_params);
  auto reference = make<torch::optim::AdamW>(reference_params);
  auto resumed = make<cqk::FusedAdamW>(resumed_params);
  for (auto* optimizer : std::vector<torch::optim::Optimizer*>{reference.get(), resumed.get()}) {
    torch::serialize::InputArchive in;
    std::istringstream stream(bytes.str());
    in.load_from(stream);
    optimizer->load(in);
  }
  for (int step = 3; step < 6; ++step) {
    set_gradients(reference_params, step, false);
    set_gradients(resumed_params, step, false);
    reference->step();
    resumed->step();
  }
  expect_same(resumed_params, reference_params);
}
