#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cqk/checkpoint.h"
#include "cqk/config_loader.h"
#include "cqk/model.h"
#include "cqk/trainer.h"
#include "saved_model.h"
#include "temp_dir.h"
#include "test_io.h"
#include "tiny_run.h"

// Checkpoint files: the round trip of model, optimizer, counters and RNG; the
// header checks that reject a damaged file; the atomic write; resume falling
// back past a corrupt newest checkpoint; the state dict for Python.
namespace {

using cqk::testing::folder_entries;
using cqk::testing::read_file;
using cqk::testing::write_file;

using cqk::testing::expect_same_weights;
using cqk::testing::TempDir;
using cqk::testing::tiny_run_config;

constexpr size_t kHeaderSize = 8 + 2 * sizeof(uint64_t);  // magic, payload size, checksum

cqk::ModelConfig tiny_model() {
  cqk::ModelConfig config;
  config.vocab_size = 32;
  config.width = 32;
  config.layers = 2;
  config.heads = 4;
  config.attention.coupling().kind() = cqk::CouplingKind::Affine;
  return config;
}

std::unique_ptr<torch::optim::AdamW> make_adamw(cqk::TransformerLM& model) {
  return std::make_unique<torch::optim::AdamW>(model->parameters(),
                                               torch::optim::AdamWOptions(1e-2).weight_decay(0.1).betas({0.9, 0.95}));
}

// One optimizer step on a fixed random batch.
void train_step(cqk::TransformerLM& model, torch::optim::Optimizer& optimizer, int64_t seed) {
  at::manual_seed(static_cast<uint64_t>(seed));
  const auto tokens = at::randint(32, {2, 16}, at::kLong);
  const auto targets = at::randint(32, {2, 16}, at::kLong);
  optimizer.zero_grad();
  model->loss(tokens, targets).backward();
  optimizer.step();
}

void expect_same_parameters(const torch::nn::Module& a, const torch::nn::Module& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& item : pa) {
    const auto* other = pb.find(item.key());
    ASSERT_NE(other, nullptr) << item.key();
    EXPECT_TRUE(at::equal(item.value(), *other)) << item.key();
  }
}

// The message of the std::runtime_error that load_checkpoint throws for `path`.
std::string load_error(const std::string& path, const std::string& expected_hash = "") {
  at::manual_seed(9);
  cqk::TransformerLM model(tiny_model());
  auto optimizer = make_adamw(model);
  try {
    cqk::load_checkpoint(path, *model, *optimizer, expected_hash);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no std::runtime_error for " << path;
  return "";
}

// A checkpoint of a model after one optimizer step, in `dir`.
std::string write_checkpoint(const TempDir& dir, const std::string& hash = "0123456789abcdef") {
  at::manual_seed(5);
  cqk::TransformerLM model(tiny_model());
  auto optimizer = make_adamw(model);
  train_step(model, *optimizer, 6);
  cqk::TrainingState state;
  state.step = 1;
  state.config_hash = hash;
  const auto path = dir / "step.ckpt";
  cqk::save_checkpoint(path, *model, *optimizer, state);
  return path;
}

TEST(Checkpoint, RoundTripRestoresModelOptimizerCountersAndRng) {
  TempDir dir("cqk-ckpt");
  at::manual_seed(1);
  cqk::TransformerLM model(tiny_model());
  auto optimizer = make_adamw(model);
  train_step(model, *optimizer, 2);
  train_step(model, *optimizer, 3);
  cqk::TrainingState state;
  state.step = 7;
  state.data_position = 11;
  state.tokens = 12345;
  state.config_hash = "0123456789abcdef";
  const auto path = cqk::checkpoint_path(dir.path(), 7);
  ::mkdir((dir / "checkpoints").c_str(), 0755);
  at::manual_seed(42);
  cqk::save_checkpoint(path, *model, *optimizer, state);
  const auto random_after_save = at::randn({8});

  // A different model and a fresh optimizer take everything from the file.
  at::manual_seed(100);
  cqk::TransformerLM restored(tiny_model());
  auto restored_optimizer = make_adamw(restored);
  const auto loaded = cqk::load_checkpoint(path, *restored, *restored_optimizer, state.config_hash);
  EXPECT_TRUE(at::equal(at::randn({8}), random_after_save)) << "the CPU RNG state is not restored";
  EXPECT_EQ(loaded.step, 7);
  EXPECT_EQ(loaded.data_position, 11);
  EXPECT_EQ(loaded.tokens, 12345);
  EXPECT_EQ(loaded.config_hash, state.config_hash);
  expect_same_parameters(*model, *restored);

  // The AdamW state of every parameter.
  const auto params = model->parameters(), restored_params = restored->parameters();
  ASSERT_EQ(params.size(), restored_params.size());
  auto& states = optimizer->state();
  auto& restored_states = restored_optimizer->state();
  ASSERT_EQ(states.size(), params.size());
  ASSERT_EQ(restored_states.size(), states.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& a = static_cast<const torch::optim::AdamWParamState&>(*states.at(params[i].unsafeGetTensorImpl()));
    const auto& b = static_cast<const torch::optim::AdamWParamState&>(
        *restored_states.at(restored_params[i].unsafeGetTensorImpl()));
    EXPECT_EQ(a.step(), 2);
    EXPECT_EQ(b.step(), a.step());
    EXPECT_TRUE(at::equal(a.exp_avg(), b.exp_avg())) << "parameter " << i;
    EXPECT_TRUE(at::equal(a.exp_avg_sq(), b.exp_avg_sq())) << "parameter " << i;
  }
  // And the next step is bitwise the same.
  train_step(model, *optimizer, 8);
  train_step(restored, *restored_optimizer, 8);
  expect_same_parameters(*model, *restored);

  // An empty expected hash skips the config check.
  cqk::TransformerLM again(tiny_model());
  auto again_optimizer = make_adamw(again);
  EXPECT_EQ(cqk::load_checkpoint(path, *again, *again_optimizer, "").step, 7);
}

TEST(Checkpoint, DamagedFilesThrowNamingTheFile) {
  TempDir dir("cqk-ckpt");
  const auto good = write_checkpoint(dir);
  const auto bytes = read_file(good);
  ASSERT_GT(bytes.size(), kHeaderSize + 100);

  const auto truncated = dir / "truncated.ckpt";
  write_file(truncated, bytes.substr(0, bytes.size() - 100));
  auto message = load_error(truncated);
  EXPECT_NE(message.find(truncated), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;

  const auto tiny = dir / "header-only.ckpt";
  write_file(tiny, bytes.substr(0, 10));
  message = load_error(tiny);
  EXPECT_NE(message.find(tiny), std::string::npos) << message;

  const auto flipped = dir / "flipped.ckpt";
  auto damaged = bytes;
  damaged[kHeaderSize + damaged.size() / 2] ^= 0x10;
  write_file(flipped, damaged);
  message = load_error(flipped);
  EXPECT_NE(message.find(flipped), std::string::npos) << message;
  EXPECT_NE(message.find("checksum"), std::string::npos) << message;

  const auto magic = dir / "magic.ckpt";
  damaged = bytes;
  damaged[0] = 'X';
  write_file(magic, damaged);
  message = load_error(magic);
  EXPECT_NE(message.find(magic), std::string::npos) << message;
  EXPECT_NE(message.find("magic"), std::string::npos) << message;

  // A file cut inside its header (a magic that matches, then nothing).
  const auto header_cut = dir / "header-cut.ckpt";
  write_file(header_cut, bytes.substr(0, 10));
  message = load_error(header_cut);
  EXPECT_NE(message.find("truncated checkpoint: 10 bytes, shorter than its " + std::to_string(kHeaderSize) +
                         "-byte header"),
            std::string::npos)
      << message;

  message = load_error(good, "fedcba9876543210");
  EXPECT_NE(message.find(good), std::string::npos) << message;
  EXPECT_NE(message.find("different config"), std::string::npos) << message;
  EXPECT_NE(message.find("config.yaml was edited"), std::string::npos) << message;

  const auto missing = dir / "missing.ckpt";
  message = load_error(missing);
  EXPECT_NE(message.find(missing), std::string::npos) << message;

  // A model of another shape or structure is refused with the file's name (not
  // a c10::Error), and before any of its tensors is replaced.
  for (const std::string change : {"width", "coupling"}) {
    at::manual_seed(1);
    auto different = tiny_model();
    if (change == "width") different.width = 64;
    else different.attention.coupling().kind() = cqk::CouplingKind::Uncoupled;
    cqk::TransformerLM other(different);
    std::vector<at::Tensor> before;
    for (const auto& p : other->parameters()) before.push_back(p.clone());
    auto optimizer = make_adamw(other);
    try {
      cqk::load_checkpoint(good, *other, *optimizer, "");
      ADD_FAILURE() << "a checkpoint of another model loaded (" << change << ")";
    } catch (const std::runtime_error& e) {
      message = e.what();
      EXPECT_NE(message.find(good), std::string::npos) << message;
      EXPECT_NE(message.find("does not fit this model"), std::string::npos) << message;
    }
    const auto after = other->parameters();
    ASSERT_EQ(after.size(), before.size());
    for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(at::equal(after[i], before[i])) << change << " " << i;
  }
}

TEST(Checkpoint, ListAndPruneKeepTheNewest) {
  TempDir dir("cqk-ckpt");
  EXPECT_TRUE(cqk::list_checkpoints(dir.path()).empty());
  ::mkdir((dir / "checkpoints").c_str(), 0755);
  for (int64_t step : {10, 2, 1000000, 30}) write_file(cqk::checkpoint_path(dir.path(), step), "x");
  write_file(dir / "checkpoints/notes.txt", "not a checkpoint");
  write_file(dir / "checkpoints/step-000000040.ckpt.tmp.123", "a temporary file");
  const auto all = cqk::list_checkpoints(dir.path());
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all.front(), cqk::checkpoint_path(dir.path(), 2));
  EXPECT_EQ(all.back(), cqk::checkpoint_path(dir.path(), 1000000));
  cqk::prune_checkpoints(dir.path(), 2);
  const auto kept = cqk::list_checkpoints(dir.path());
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0], cqk::checkpoint_path(dir.path(), 30));
  EXPECT_EQ(kept[1], cqk::checkpoint_path(dir.path(), 1000000));
  cqk::prune_checkpoints(dir.path(), 0);  // keeps at least one
  EXPECT_EQ(cqk::list_checkpoints(dir.path()).size(), 1u);
  EXPECT_EQ(folder_entries(dir / "checkpoints").size(), 3u);  // the other files are left alone
}

TEST(Checkpoint, ResumeFallsBackToThePreviousCheckpointWhenTheNewestIsCorrupt) {
  TempDir reference_dir("cqk-ckpt-ref"), dir("cqk-ckpt-fallback");
  const auto config = tiny_run_config();
  cqk::TrainOptions options;
  options.run_dir = reference_dir.path();
  ASSERT_EQ(cqk::train(config, options).outcome, cqk::TrainOutcome::Finished);

  options.run_dir = dir.path();
  options.max_steps = 5;
  const auto paused = cqk::train(config, options);
  ASSERT_EQ(paused.outcome, cqk::TrainOutcome::Paused);
  ASSERT_EQ(paused.step, 5);
  const auto checkpoints = cqk::list_checkpoints(dir.path());
  ASSERT_EQ(checkpoints.size(), 2u);
  EXPECT_EQ(checkpoints[0], cqk::checkpoint_path(dir.path(), 4));
  EXPECT_EQ(checkpoints[1], cqk::checkpoint_path(dir.path(), 5));
  auto bytes = read_file(checkpoints[1]);
  bytes[bytes.size() - 10] ^= 0x01;
  write_file(checkpoints[1], bytes);

  options.resume = true;
  options.max_steps = 0;
  const auto resumed = cqk::train(config, options);
  EXPECT_EQ(resumed.outcome, cqk::TrainOutcome::Finished);
  EXPECT_EQ(resumed.step, 12);
  const auto log = read_file(dir / "train.log");
  EXPECT_NE(log.find("trying the previous checkpoint"), std::string::npos) << log;
  EXPECT_NE(log.find("resumed from " + checkpoints[0]), std::string::npos) << log;
  // Resumed from step 4, the run still ends bitwise where the uninterrupted one did.
  expect_same_weights(reference_dir / "model.pt", dir / "model.pt", "resumed from the previous checkpoint");

  // With every checkpoint corrupt, resume fails with the oldest file's error
  // (of a run not finished yet: a finished one has nothing to resume).
  std::filesystem::remove(dir / "results.json");
  for (const auto& path : cqk::list_checkpoints(dir.path())) write_file(path, "garbage");
  try {
    cqk::train(config, options);
    ADD_FAILURE() << "resumed from corrupt checkpoints";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(cqk::list_checkpoints(dir.path()).front()), std::string::npos) << e.what();
  }
}

// model.pt as Python sees it. torch::pickle_save writes torch.save's zip
// container holding a dict of tensors, but the pickle tags the typed dict with
// torch.jit._pickle.restore_type_tag, which torch.load's default
// weights_only=True (torch >= 2.6) rejects ("Unsupported global"). Loading
// works with weights_only=False, or with weights_only=True inside
// torch.serialization.safe_globals([torch.jit._pickle.restore_type_tag]);
// both are checked here (torch 2.11). The script prints whether the plain
// default works, for information only.
TEST(Checkpoint, WeightsForPythonLoadWithTorchLoad) {
  const std::string python = CQK_PYTHON;
  if (python.empty() || ::access(python.c_str(), X_OK) != 0)
    GTEST_SKIP() << "no torch Python (CQK_PYTHON='" << python << "')";
  TempDir dir("cqk-pt");
  at::manual_seed(7);
  cqk::TransformerLM model(tiny_model());
  {
    at::NoGradGuard no_grad;  // a non-zero coupling, so every tensor has a distinctive sum
    for (auto& p : model->parameters()) p.add_(at::randn_like(p) * 0.01);
  }
  const auto path = dir / "model.pt";
  cqk::save_weights_for_python(path, *model);
  const size_t tensors = model->named_parameters().size() + model->named_buffers().size();
  const double expected_sum = model->embedding->weight.to(at::kDouble).sum().item<double>();
  const double expected_coupling_sum =
      model->named_parameters()["blocks.1.attention.coupling.conditioner1.w2"].to(at::kDouble).sum().item<double>();

  const std::string script =
      "import sys, torch, torch.jit._pickle\n"
      "path = sys.argv[1]\n"
      "try:\n"
      "    torch.load(path); default = 'default-loads'\n"
      "except Exception:\n"
      "    default = 'default-refuses'\n"
      "sd = torch.load(path, weights_only=False)\n"
      "with torch.serialization.safe_globals([torch.jit._pickle.restore_type_tag]):\n"
      "    safe = torch.load(path, weights_only=True)\n"
      "same = sd.keys() == safe.keys() and all(torch.equal(sd[k], safe[k]) for k in sd)\n"
      "print(type(sd).__name__, len(sd), repr(sd['embedding.weight'].double().sum().item()),\n"
      "      repr(sd['blocks.1.attention.coupling.conditioner1.w2'].double().sum().item()),\n"
      "      all(isinstance(v, torch.Tensor) for v in sd.values()), same, default)\n";
  const auto script_path = dir / "check.py";
  write_file(script_path, script);
  const auto check = cqk::testing::run_command(python + " " + script_path + " " + path);
  const std::string& output = check.out;
  ASSERT_EQ(check.exit_code, 0) << output;
  std::istringstream fields(output);
  std::string type, all_tensors, same, default_load;
  size_t count = 0;
  double sum = 0.0, coupling_sum = 0.0;
  fields >> type >> count >> sum >> coupling_sum >> all_tensors >> same >> default_load;
  ASSERT_FALSE(fields.fail()) << output;
  std::printf("torch.load(model.pt) with the default weights_only: %s\n", default_load.c_str());
  EXPECT_EQ(same, "True") << output;
  EXPECT_EQ(type, "dict") << output;
  EXPECT_EQ(count, tensors) << output;
  EXPECT_NEAR(sum, expected_sum, 1e-6) << output;
  EXPECT_NEAR(coupling_sum, expected_coupling_sum, 1e-6) << output;
  EXPECT_EQ(all_tensors, "True") << output;
}

}  // namespace
