// The __host__ __device__ math of the fused coupling kernels
// (kernels/coupling_math.cuh), compiled here as plain C++: the backward against
// autograd of the ATen QKCoupling, and the kernels' own decomposition (a token's
// channels split over lanes, the packed shared-memory weight layout, the staged
// weight-gradient reduction) emulated with one CPU thread per GPU thread. What
// is left for the GPU tests (tests/fused_coupling_test.cpp) is the CUDA
// plumbing: loads and stores, shuffles, launch geometry and atomics.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coupling_math.cuh"
#include "qk_norm_math.cuh"
#include "cqk/coupling.h"
#include "tools/tensor_compare.h"

namespace {

namespace kn = cqk::kernels;
using cqk::CouplingKind;
using cqk::CouplingOptions;
using cqk::QKCoupling;

// Random weights of scale 0.15 sqrt(64 / D): log-scales s of order +-0.5, a
// clearly non-trivial map whose float32 inverse still loses only ~1e-6 over four
// steps (at 0.2 the rebuilt inputs already drift by 5e-5 from float64: that is
// the conditioning of the map, not the kernels, and the fp32 tolerance is 1e-5).
void randomise(QKCoupling& coupling) {
  at::NoGradGuard no_grad;
  const double scale = 0.15 * std::sqrt(64.0 / static_cast<double>(coupling->options().head_dim()));
  for (auto& p : coupling->parameters()) p.copy_(at::randn_like(p) * scale);
}

using cqk::testing::max_relative_error;

double max_relative_error(const std::vector<float>& actual, const std::vector<float>& expected) {
  return max_relative_error(at::tensor(actual), at::tensor(expected));
}

std::vector<float> to_vector(const at::Tensor& t) {
  const auto c = t.to(at::kFloat).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// One step's weights of one group as float32 vectors (torch layout).
struct StepWeights {
  std::vector<float> w1, b1, w2, b2;
  kn::AffineStepWeights view() const { return {w1.data(), b1.data(), w2.data(), b2.data()}; }
};

std::vector<StepWeights> step_weights(QKCoupling& coupling, int64_t group) {
  auto params = coupling->named_parameters();
  std::vector<StepWeights> steps;
  for (int64_t s = 0; s < coupling->options().steps(); ++s) {
    const std::string prefix = "conditioner" + std::to_string(s) + ".";
    steps.push_back({to_vector(params[prefix + "w1"][group]), to_vector(params[prefix + "b1"][group]),
                     to_vector(params[prefix + "w2"][group]), to_vector(params[prefix + "b2"][group])});
  }
  return steps;
}

// Gradient accumulators of one step of one group, torch layout.
struct StepGrads {
  std::vector<float> w1, b1, w2, b2;
  StepGrads(int d, int r) : w1(r * d), b1(r), w2(2 * d * r), b2(2 * d) {}
  kn::AffineStepGrads view() { return {w1.data(), b1.data(), w2.data(), b2.data()}; }
};

// --- 1. The per-token backward against autograd ------------------------------

template <int D, int R>
void check_backward_against_autograd(int steps, bool shared) {
  SCOPED_TRACE("D=" + std::to_string(D) + " R=" + std::to_string(R) + " steps=" + std::to_string(steps) +
               (shared ? " shared" : " per-head"));
  at::manual_seed(10 + steps + (shared ? 100 : 0));
  const int64_t batch = 2, heads = 3, time = 3;
  QKCoupling coupling(
      CouplingOptions(CouplingKind::Affine, heads, D).hidden(R).steps(steps).shared_across_heads(shared));
  coupling->to(at::kDouble);
  randomise(coupling);
  auto q = at::randn({batch, heads, time, D}, at::kDouble).requires_grad_();
  auto k = at::randn({batch, heads, time, D}, at::kDouble).requires_grad_();
  const auto grad_q_out = at::randn({batch, heads, time, D}, at::kDouble);
  const auto grad_k_out = at::randn({batch, heads, time, D}, at::kDouble);
  auto [q_out, k_out] = coupling->forward(q, k);
  ASSERT_GT(max_relative_error(k_out, k), 0.05) << "the randomised map must be far from the identity";
  ((q_out * grad_q_out).sum() + (k_out * grad_k_out).sum()).backward();

  const int64_t groups = shared ? 1 : heads;
  std::vector<std::vector<StepWeights>> weights;
  std::vector<std::vector<StepGrads>> grads(groups, std::vector<StepGrads>(steps, StepGrads(D, R)));
  for (int64_t g = 0; g < groups; ++g) weights.push_back(step_weights(coupling, g));

  auto rebuilt_q = at::empty({batch, heads, time, D}), rebuilt_k = at::empty_like(rebuilt_q);
  auto dq = at::empty_like(rebuilt_q), dk = at::empty_like(rebuilt_q);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = shared ? 0 : h;
      std::vector<kn::AffineStepWeights> w;
      std::vector<kn::AffineStepGrads> gr;
      for (int s = 0; s < steps; ++s) {
        w.push_back(weights[g][s].view());
        gr.push_back(grads[g][s].view());
      }
      for (int64_t t = 0; t < time; ++t) {
        auto qv = to_vector(q_out[b][h][t].detach()), kv = to_vector(k_out[b][h][t].detach());
        auto gq = to_vector(grad_q_out[b][h][t]), gk = to_vector(grad_k_out[b][h][t]);
        kn::affine_coupling_backward<D, R>(qv.data(), kv.data(), gq.data(), gk.data(), w.data(), steps, 2.0f,
                                           gr.data());
        rebuilt_q[b][h][t].copy_(at::tensor(qv));
        rebuilt_k[b][h][t].copy_(at::tensor(kv));
        dq[b][h][t].copy_(at::tensor(gq));
        dk[b][h][t].copy_(at::tensor(gk));
      }
    }
  }
  constexpr double kTolerance = 1e-4;
  EXPECT_LT(max_relative_error(rebuilt_q, q.detach()), 1e-5) << "inverse of q";
  EXPECT_LT(max_relative_error(rebuilt_k, k.detach()), 1e-5) << "inverse of k";
  EXPECT_LT(max_relative_error(dq, q.grad()), kTolerance) << "dq";
  EXPECT_LT(max_relative_error(dk, k.grad()), kTolerance) << "dk";
  auto params = coupling->named_parameters();
  for (int s = 0; s < steps; ++s) {
    const std::string prefix = "conditioner" + std::to_string(s) + ".";
    for (const char* name : {"w1", "b1", "w2", "b2"}) {
      std::vector<float> ours;
      for (int64_t g = 0; g < groups; ++g) {
        const auto& sg = grads[g][s];
        const auto& part = std::string(name) == "w1" ? sg.w1 : std::string(name) == "b1" ? sg.b1
                         : std::string(name) == "w2" ? sg.w2 : sg.b2;
        ours.insert(ours.end(), part.begin(), part.end());
      }
      const auto expected = params[prefix + name].grad();
      ASSERT_TRUE(expected.defined()) << prefix + name;
      EXPECT_LT(max_relative_error(at::tensor(ours).view(expected.sizes()), expected), kTolerance) << prefix + name;
    }
  }
}

TEST(KernelMath, BackwardMatchesAutogradOfTheAtenCoupling) {
  for (int steps : {2, 4}) {
    for (bool shared : {false, true}) check_backward_against_autograd<64, 8>(steps, shared);
  }
}

TEST(KernelMath, BackwardMatchesAutogradForTheOtherCompiledShapes) {
  check_backward_against_autograd<128, 8>(2, false);
  check_backward_against_autograd<64, 16>(3, true);
  check_backward_against_autograd<128, 16>(1, false);
}

// --- 2. The packed shared-memory layout ---------------------------------------

template <int D, int R>
void check_packed_layout() {
  SCOPED_TRACE("D=" + std::to_string(D) + " R=" + std::to_string(R));
  using Layout = kn::PackedStepLayout<D, R>;
  static_assert(Layout::kFloats == 3 * D * R + R + 2 * D, "one float per parameter");
  static_assert(Layout::kW2S % 4 == 0 && Layout::kW2T % 4 == 0 && Layout::kB2S % 4 == 0 && Layout::kFloats % 4 == 0,
                "sections on 16-byte boundaries");
  // Distinct values, so that gather is a permutation iff every value appears once.
  std::vector<float> w1(R * D), b1(R), w2(2 * D * R), b2(2 * D);
  float next = 1.0f;
  for (auto* v : {&w1, &b1, &w2, &b2})
    for (auto& x : *v) x = next++;
  const kn::AffineStepWeights dense{w1.data(), b1.data(), w2.data(), b2.data()};
  std::vector<float> packed(Layout::kFloats);
  for (int o = 0; o < Layout::kFloats; ++o) packed[o] = Layout::gather(dense, o);
  auto sorted = packed;
  std::sort(sorted.begin(), sorted.end());
  for (int o = 0; o < Layout::kFloats; ++o) ASSERT_EQ(sorted[o], o + 1.0f) << "gather is not a permutation";

  const kn::DenseStepView<D, R> a{dense};
  const kn::PackedStepView<D, R> b{packed.data()};
  const auto same = [](const kn::Vec4& x, const kn::Vec4& y) {
    return x.v[0] == y.v[0] && x.v[1] == y.v[1] && x.v[2] == y.v[2] && x.v[3] == y.v[3];
  };
  for (int c = 0; c < D; c += 4) {
    for (int r = 0; r < R; ++r) ASSERT_TRUE(same(a.w1(r, c), b.w1(r, c))) << "w1 r=" << r << " c=" << c;
    ASSERT_TRUE(same(a.b2s(c), b.b2s(c))) << c;
    ASSERT_TRUE(same(a.b2t(c), b.b2t(c))) << c;
  }
  for (int c = 0; c < D; ++c) {
    for (int r4 = 0; r4 < R / 4; ++r4) {
      ASSERT_TRUE(same(a.w2s(c, r4), b.w2s(c, r4))) << "w2s c=" << c << " r4=" << r4;
      ASSERT_TRUE(same(a.w2t(c, r4), b.w2t(c, r4))) << "w2t c=" << c << " r4=" << r4;
    }
  }
  for (int r = 0; r < R; ++r) ASSERT_EQ(a.b1(r), b.b1(r));
  // Bank-conflict freedom: for a fixed (r, half) or (j, r4), the L lanes of a
  // group read consecutive 16-byte words.
  for (int l = 1; l < Layout::L; ++l) {
    ASSERT_EQ(Layout::channel_slot(l * kn::kLaneChannels) - Layout::channel_slot((l - 1) * kn::kLaneChannels), 4);
    ASSERT_EQ(Layout::w2_slot(l * kn::kLaneChannels, 0) - Layout::w2_slot((l - 1) * kn::kLaneChannels, 0), 4);
  }
}

TEST(KernelMath, PackedWeightLayoutIsAPermutationReadBackByTheView) {
  check_packed_layout<64, 8>();
  check_packed_layout<64, 16>();
  check_packed_layout<128, 8>();
  check_packed_layout<128, 16>();
}

// --- 3. The kernels' decomposition, one CPU thread per GPU thread -------------

class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation != generation_; });
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int count_, arrived_ = 0, generation_ = 0;
};

// A thread block of `slots` tokens x L lanes, with the kernel's shared memory.
template <int D, int R>
struct EmulatedBlock {
  static constexpr int L = D / kn::kLaneChannels;
  int slots, threads;
  Barrier barrier;
  std::vector<float> reduce_buffer;  // [slot][lane][R]
  std::vector<float> g2, xs, hg;     // the staging of StagingSink
  std::vector<float> acc;            // [steps][GradLayout::kFloats]
  int n_valid = 0;
  EmulatedBlock(int slots, int steps)
      : slots(slots), threads(slots * L), barrier(slots * L), reduce_buffer(slots * L * R), g2(slots * 2 * D),
        xs(slots * D), hg(slots * 2 * R), acc(steps * kn::GradLayout<D, R>::kFloats, 0.0f) {}
};

// The ShuffleReduce of the kernels: sums over the L lanes of a token.
template <int D, int R>
struct EmulatedReduce {
  EmulatedBlock<D, R>* block;
  int slot, lane;
  template <int N>
  void operator()(float (&v)[N]) const {
    static_assert(N <= R, "reductions are R wide");
    constexpr int L = EmulatedBlock<D, R>::L;
    float* mine = &block->reduce_buffer[(slot * L + lane) * R];
    for (int i = 0; i < N; ++i) mine[i] = v[i];
    block->barrier.wait();
    for (int i = 0; i < N; ++i) {
      float sum = 0.0f;
      for (int l = 0; l < L; ++l) sum += block->reduce_buffer[(slot * L + l) * R + i];
      v[i] = sum;
    }
    block->barrier.wait();
  }
};

// The StagingSink of the kernels: stage, barrier, block-wide tasks, barrier.
template <int D, int R>
struct EmulatedSink {
  EmulatedBlock<D, R>* block;
  int slot, tid;
  bool valid;
  template <int CPL>
  void operator()(int step, int c0, const float (&x)[CPL], const float (&gsr)[CPL], const float (&gt)[CPL],
                  const float (&h)[R], const float (&ga)[R]) {
    auto& b = *block;
    if (valid) {
      for (int i = 0; i < CPL; ++i) {
        b.g2[slot * 2 * D + c0 + i] = gsr[i];
        b.g2[slot * 2 * D + D + c0 + i] = gt[i];
        b.xs[slot * D + c0 + i] = x[i];
      }
      if (c0 == 0) {
        for (int r = 0; r < R; ++r) {
          b.hg[slot * 2 * R + r] = h[r];
          b.hg[slot * 2 * R + R + r] = ga[r];
        }
      }
    }
    b.barrier.wait();
    using G = kn::GradLayout<D, R>;
    for (int task = tid; task < G::kTasks; task += b.threads)
      kn::weight_grad_task<D, R>(task, b.n_valid, b.g2.data(), b.xs.data(), b.hg.data(), b.acc.data() + step * G::kFloats);
    b.barrier.wait();
  }
};

template <int D, int R>
void check_lane_split(int steps) {
  SCOPED_TRACE("D=" + std::to_string(D) + " R=" + std::to_string(R) + " steps=" + std::to_string(steps));
  constexpr int L = D / kn::kLaneChannels, CPL = kn::kLaneChannels;
  using Layout = kn::PackedStepLayout<D, R>;
  at::manual_seed(20 + steps);
  QKCoupling coupling(CouplingOptions(CouplingKind::Affine, 1, D).hidden(R).steps(steps));
  randomise(coupling);
  const auto weights = step_weights(coupling, 0);
  std::vector<kn::AffineStepWeights> dense;
  std::vector<std::vector<float>> packed;
  for (const auto& w : weights) {
    dense.push_back(w.view());
    packed.emplace_back(Layout::kFloats);
    for (int o = 0; o < Layout::kFloats; ++o) packed.back()[o] = Layout::gather(w.view(), o);
  }
  const auto views = [&](int i) { return kn::PackedStepView<D, R>{packed[i].data()}; };

  // 7 tokens through a block of 4 slots: one full batch, then a partial one.
  constexpr int kTokens = 7, kSlots = 4;
  // q, k, grad q_out, grad k_out of each token, as plain vectors (the threads below read them).
  const auto inputs = at::randn({4, kTokens, D});
  std::vector<std::vector<float>> rows[4];
  for (int which = 0; which < 4; ++which)
    for (int t = 0; t < kTokens; ++t) rows[which].push_back(to_vector(inputs[which][t]));
  const auto row = [&](int which, int token) -> const std::vector<float>& { return rows[which][token]; };

  // The reference: one lane owning all D channels, torch-layout weights.
  std::vector<StepGrads> ref_grads(steps, StepGrads(D, R));
  std::vector<kn::AffineStepGrads> ref_grad_views;
  for (auto& g : ref_grads) ref_grad_views.push_back(g.view());
  std::vector<std::vector<float>> ref_out(kTokens), ref_back(kTokens), ref_dq(kTokens), ref_dk(kTokens);
  for (int t = 0; t < kTokens; ++t) {
    auto q = row(0, t), k = row(1, t);
    kn::affine_coupling_forward<D, R>(q.data(), k.data(), dense.data(), steps, 2.0f);
    ref_out[t] = q;
    ref_out[t].insert(ref_out[t].end(), k.begin(), k.end());
    auto gq = row(2, t), gk = row(3, t);
    kn::affine_coupling_backward<D, R>(q.data(), k.data(), gq.data(), gk.data(), dense.data(), steps, 2.0f,
                                       ref_grad_views.data());
    ref_back[t] = q;
    ref_back[t].insert(ref_back[t].end(), k.begin(), k.end());
    ref_dq[t] = gq;
    ref_dk[t] = gk;
  }

  EmulatedBlock<D, R> block(kSlots, steps);
  std::vector<std::vector<float>> out(kTokens, std::vector<float>(2 * D)), back = out, dq = out, dk = out;
  for (int first = 0; first < kTokens; first += kSlots) {
    block.n_valid = std::min(kSlots, kTokens - first);
    std::vector<std::thread> threads;
    for (int tid = 0; tid < block.threads; ++tid) {
      threads.emplace_back([&, tid, first] {
        const int slot = tid / L, lane = tid % L, c0 = lane * CPL;
        const bool valid = slot < block.n_valid;
        const int token = first + (valid ? slot : block.n_valid - 1);
        float q[CPL], k[CPL], gq[CPL], gk[CPL];
        const auto fill = [&](float (&v)[CPL], int which) {
          const auto& full = row(which, token);
          for (int i = 0; i < CPL; ++i) v[i] = full[c0 + i];
        };
        fill(q, 0);
        fill(k, 1);
        const EmulatedReduce<D, R> reduce{&block, slot, lane};
        kn::lane_coupling_forward<R, CPL>(views, steps, 2.0f, c0, q, k, reduce);
        if (valid)
          for (int i = 0; i < CPL; ++i) out[token][c0 + i] = q[i], out[token][D + c0 + i] = k[i];
        // The backward starts from the reference outputs, like the kernel from the saved ones.
        for (int i = 0; i < CPL; ++i) q[i] = ref_out[token][c0 + i], k[i] = ref_out[token][D + c0 + i];
        fill(gq, 2);
        fill(gk, 3);
        EmulatedSink<D, R> sink{&block, slot, tid, valid};
        kn::lane_coupling_backward<R, CPL>(views, steps, 2.0f, c0, q, k, gq, gk, reduce, sink);
        if (valid) {
          for (int i = 0; i < CPL; ++i) {
            back[token][c0 + i] = q[i], back[token][D + c0 + i] = k[i];
            dq[token][c0 + i] = gq[i], dk[token][c0 + i] = gk[i];
          }
        }
      });
    }
    for (auto& t : threads) t.join();
  }

  for (int t = 0; t < kTokens; ++t) {
    EXPECT_LT(max_relative_error(out[t], ref_out[t]), 1e-5) << "forward, token " << t;
    EXPECT_LT(max_relative_error(back[t], ref_back[t]), 1e-5) << "rebuilt inputs, token " << t;
    EXPECT_LT(max_relative_error(std::vector<float>(dq[t].begin(), dq[t].begin() + D), ref_dq[t]), 1e-5) << "dq " << t;
    EXPECT_LT(max_relative_error(std::vector<float>(dk[t].begin(), dk[t].begin() + D), ref_dk[t]), 1e-5) << "dk " << t;
  }
  using G = kn::GradLayout<D, R>;
  for (int s = 0; s < steps; ++s) {
    const float* acc = block.acc.data() + s * G::kFloats;
    const auto slice = [&](int begin, int end) { return std::vector<float>(acc + begin, acc + end); };
    EXPECT_LT(max_relative_error(slice(G::kW1, G::kB1), ref_grads[s].w1), 1e-5) << "dW1 step " << s;
    EXPECT_LT(max_relative_error(slice(G::kB1, G::kW2), ref_grads[s].b1), 1e-5) << "db1 step " << s;
    EXPECT_LT(max_relative_error(slice(G::kW2, G::kB2), ref_grads[s].w2), 1e-5) << "dW2 step " << s;
    EXPECT_LT(max_relative_error(slice(G::kB2, G::kFloats), ref_grads[s].b2), 1e-5) << "db2 step " << s;
  }
}

TEST(KernelMath, LaneSplitWithPackedWeightsMatchesTheSingleLaneMath) {
  check_lane_split<64, 8>(2);
  check_lane_split<64, 16>(3);
  check_lane_split<128, 8>(4);
  check_lane_split<128, 16>(1);
}

// The inverse of the lane-split forward, and the forward of the single-lane API,
// agree with the ATen module in float32.
TEST(KernelMath, SingleLaneForwardAndInverseMatchTheAtenPathForFourSteps) {
  constexpr int D = 64, R = 8, Steps = 4;
  at::manual_seed(30);
  QKCoupling coupling(CouplingOptions(CouplingKind::Affine, 1, D).hidden(R).steps(Steps));
  randomise(coupling);
  const auto q = at::randn({1, 1, 5, D}), k = at::randn({1, 1, 5, D});
  const auto [q_ref, k_ref] = coupling->forward(q, k);
  const auto weights = step_weights(coupling, 0);
  std::vector<kn::AffineStepWeights> w;
  for (const auto& s : weights) w.push_back(s.view());
  for (int64_t t = 0; t < 5; ++t) {
    auto qv = to_vector(q[0][0][t]), kv = to_vector(k[0][0][t]);
    kn::affine_coupling_forward<D, R>(qv.data(), kv.data(), w.data(), Steps, 2.0f);
    EXPECT_LT(max_relative_error(qv, to_vector(q_ref[0][0][t])), 1e-5);
    EXPECT_LT(max_relative_error(kv, to_vector(k_ref[0][0][t])), 1e-5);
    kn::affine_coupling_inverse<D, R>(qv.data(), kv.data(), w.data(), Steps, 2.0f);
    EXPECT_LT(max_relative_error(qv, to_vector(q[0][0][t])), 1e-5);
    EXPECT_LT(max_relative_error(kv, to_vector(k[0][0][t])), 1e-5);
  }
}

// QK-norm as the fused kernel runs it (qk_norm_math.cuh): one token's channels
// over D/8 lanes, one CPU thread per lane, the sums through the emulated
// shuffle reduction. Forward, input gradient and the weight gradient's terms
// against autograd of RMSNorm in float64.
template <int D>
void check_lane_split_qk_norm() {
  constexpr int L = D / kn::kLaneChannels, T = 6;
  constexpr float kEps = 1e-5f;
  at::manual_seed(40 + D);
  // Token rows of different scales, one nearly zero (where eps matters).
  const auto x = at::randn({T, D}, at::kDouble) * at::tensor({1.0, 0.1, 3.0, 1e-3, 1.0, 20.0}, at::kDouble).view({T, 1});
  const auto w = 1.0 + 0.3 * at::randn({D}, at::kDouble), g = at::randn({T, D}, at::kDouble);
  auto xr = x.clone().requires_grad_(), wr = w.clone().requires_grad_();
  const auto y = xr * at::rsqrt(xr.pow(2).mean(-1, /*keepdim=*/true) + kEps) * wr;
  torch::autograd::backward({y}, {g});
  const auto as_floats = [](const at::Tensor& t) {
    const auto f = t.to(at::kFloat).contiguous();
    return std::vector<float>(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
  };
  const auto xs = as_floats(x), ws = as_floats(w), gs = as_floats(g);
  std::vector<float> y_got(T * D), gx_got(T * D), gw_got(D, 0.0f);
  for (int t = 0; t < T; ++t) {
    EmulatedBlock<D, 8> block(/*slots=*/1, /*steps=*/1);
    std::vector<std::thread> threads;
    for (int lane = 0; lane < L; ++lane) {
      threads.emplace_back([&, lane] {
        const int c0 = lane * kn::kLaneChannels;
        const EmulatedReduce<D, 8> reduce{&block, 0, lane};
        float v[kn::kLaneChannels], xin[kn::kLaneChannels], gv[kn::kLaneChannels], gw[kn::kLaneChannels];
        for (int i = 0; i < kn::kLaneChannels; ++i) {
          v[i] = xin[i] = xs[t * D + c0 + i];
          gv[i] = gs[t * D + c0 + i];
        }
        kn::lane_rms_norm<D>(v, ws.data() + c0, kEps, reduce);
        kn::lane_rms_norm_backward<D>(xin, gv, ws.data() + c0, kEps, gw, reduce);
        for (int i = 0; i < kn::kLaneChannels; ++i) {
          y_got[t * D + c0 + i] = v[i];
          gx_got[t * D + c0 + i] = gv[i];
          gw_got[c0 + i] += gw[i];  // each lane owns its channels
        }
      });
    }
    for (auto& th : threads) th.join();
  }
  const auto tensor = [](const std::vector<float>& v, at::IntArrayRef shape) {
    return at::tensor(v).to(at::kDouble).reshape(shape);
  };
  EXPECT_LT(cqk::testing::max_relative_error(tensor(y_got, {T, D}), y.detach()), 2e-6) << "forward, D " << D;
  EXPECT_LT(cqk::testing::max_relative_error(tensor(gx_got, {T, D}), xr.grad()), 2e-5) << "dx, D " << D;
  EXPECT_LT(cqk::testing::max_relative_error(tensor(gw_got, {D}), wr.grad()), 2e-5) << "dw, D " << D;
}

TEST(KernelMath, LaneSplitQKNormMatchesAutogradOfRMSNormInFloat64) {
  check_lane_split_qk_norm<64>();
  check_lane_split_qk_norm<128>();
}

}  // namespace
