#include "cqk/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Dict.h>
#include <torch/serialize.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "cqk/atomic_file.h"

namespace cqk {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'C', 'Q', 'K', 'C', 'K', 'P', 'T', '1'};
constexpr size_t kHeaderSize = sizeof(kMagic) + 2 * sizeof(uint64_t);

uint64_t fnv1a(const std::string& bytes) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : bytes) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

// Module::load silently replaces a tensor by a stored one of another shape
// (Tensor::set_), so the shapes are compared first, walking the archive as it does.
void check_fits(const torch::nn::Module& module, torch::serialize::InputArchive& archive, const std::string& prefix,
                const std::string& path) {
  const auto check = [&](const std::string& key, const at::Tensor& expected, bool is_buffer) {
    at::Tensor stored;
    if (!archive.try_read(key, stored, is_buffer))
      fail(path, "checkpoint does not fit this model: no " + prefix + key);
    if (stored.sizes() != expected.sizes()) {
      std::ostringstream message;
      message << "checkpoint does not fit this model: " << prefix << key << " has shape " << stored.sizes()
              << " in the file, " << expected.sizes() << " in the model";
      fail(path, message.str());
    }
  };
  for (const auto& item : module.named_parameters(/*recurse=*/false)) check(item.key(), item.value(), false);
  for (const auto& item : module.named_buffers(/*recurse=*/false)) check(item.key(), item.value(), true);
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::InputArchive child_archive;
    if (!archive.try_read(child.key(), child_archive))
      fail(path, "checkpoint does not fit this model: no " + prefix + child.key());
    check_fits(*child.value(), child_archive, prefix + child.key() + ".", path);
  }
}

}  // namespace

void save_checkpoint(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                     const TrainingState& state) {
  torch::serialize::OutputArchive archive, model_archive, optimizer_archive;
  model.save(model_archive);
  optimizer.save(optimizer_archive);
  archive.write("model", model_archive);
  archive.write("optimizer", optimizer_archive);
  archive.write("step", c10::IValue(state.step));
  archive.write("data_position", c10::IValue(state.data_position));
  archive.write("tokens", c10::IValue(state.tokens));
  archive.write("config_hash", c10::IValue(state.config_hash));
  archive.write("initialisation", c10::IValue(state.initialisation));
  archive.write("data_fingerprint", c10::IValue(state.data_fingerprint));
  archive.write("peak_flops", c10::IValue(state.peak_flops));
  archive.write("rng_cpu", at::detail::getDefaultCPUGenerator().get_state());
  std::ostringstream payload;
  archive.save_to(payload);

  const std::string body = payload.str();
  std::string file(kMagic, sizeof(kMagic));
  const uint64_t size = body.size(), checksum = fnv1a(body);
  file.append(reinterpret_cast<const char*>(&size), sizeof(size));
  file.append(reinterpret_cast<const char*>(&checksum), sizeof(checksum));
  file += body;
  write_file_atomically(path, file);
}

namespace {

// optimizer null: model only, and the global RNG state is not restored either.
TrainingState load_checkpoint_into(const std::string& path, torch::nn::Module& model,
                                   torch::optim::Optimizer* optimizer, const std::string& expected_config_hash) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open checkpoint");
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (file.size() < sizeof(kMagic) || std::memcmp(file.data(), kMagic, sizeof(kMagic)) != 0)
    fail(path, "not a cqk checkpoint (bad magic at offset 0)");
  if (file.size() < kHeaderSize)
    fail(path, "truncated checkpoint: " + std::to_string(file.size()) + " bytes, shorter than its " +
                   std::to_string(kHeaderSize) + "-byte header");
  uint64_t size = 0, checksum = 0;
  std::memcpy(&size, file.data() + sizeof(kMagic), sizeof(size));
  std::memcpy(&checksum, file.data() + sizeof(kMagic) + sizeof(size), sizeof(checksum));
  if (file.size() - kHeaderSize != size)
    fail(path, "truncated checkpoint: header says " + std::to_string(size) + " payload bytes, file has " +
                   std::to_string(file.size() - kHeaderSize));
  const std::string body = file.substr(kHeaderSize);
  if (fnv1a(body) != checksum) fail(path, "checkpoint checksum mismatch (the file is corrupt)");

  torch::serialize::InputArchive archive, model_archive, optimizer_archive;
  std::istringstream payload(body);
  archive.load_from(payload);
  TrainingState state;
  c10::IValue value;
  archive.read("config_hash", value);
  state.config_hash = value.toStringRef();
  if (archive.try_read("initialisation", value)) state.initialisation = value.toStringRef();
  if (archive.try_read("data_fingerprint", value)) state.data_fingerprint = value.toStringRef();
  if (archive.try_read("peak_flops", value)) state.peak_flops = value.toDouble();
  if (!expected_config_hash.empty() && state.config_hash != expected_config_hash)
    fail(path, "checkpoint was written by a different config (hash " + state.config_hash + ", expected " +
                   expected_config_hash + "): the run's config.yaml was edited, or the checkpoint is another run's");
  archive.read("model", model_archive);
  archive.read("optimizer", optimizer_archive);
  check_fits(model, model_archive, "", path);
  try {
    model.load(model_archive);
  } catch (const c10::Error& e) {
    fail(path, std::string("checkpoint does not fit this model: ") + e.what_without_backtrace());
  }
  if (optimizer != nullptr) optimizer->load(optimizer_archive);
  archive.read("step", value);
  state.step = value.toInt();
  archive.read("data_position", value);
  state.data_position = value.toInt();
  archive.read("tokens", value);
  state.tokens = value.toInt();
  if (optimizer == nullptr) return state;
  at::Tensor rng;
  archive.read("rng_cpu", rng);
  auto generator = at::detail::getDefaultCPUGenerator();
  generator.set_state(rng);
  return state;
}

}  // namespace

TrainingState load_checkpoint(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                              const std::string& expected_config_hash) {
  return load_checkpoint_into(path, model, &optimizer, expected_config_hash);
}

TrainingState load_checkpoint(const std::string& path, torch::nn::Module& model,
                              const std::string& expected_config_hash) {
  return load_checkpoint_into(path, model, nullptr, expected_config_hash);
}

std::string checkpoint_path(const std::string& run_dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "step-%09lld.ckpt", static_cast<long long>(step));
  return (fs::path(run_dir) / "checkpoints" / name).string();
}

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
  std::vector<std::string> found;
  const auto folder = fs::path(run_dir) / "checkpoints";
  if (!fs::is_directory(folder)) return found;
  for (const auto& entry : fs::directory_iterator(folder)) {
    const auto name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && entry.path().extension() == ".ckpt") found.push_back(entry.path().string());
  }
  std::sort(found.begin(), found.end());  // zero-padded step numbers sort by step
  return found;
}

void prune_checkpoints(const std::string& run_dir, int64_t keep) {
  auto all = list_checkpoints(run_dir);
  for (size_t i = 0; i + static_cast<size_t>(std::max<int64_t>(keep, 1)) < all.size(); ++i) fs::remove(all[i]);
}

void save_weights_for_python(const std::string& path, const torch::nn::Module& model) {
  c10::Dict<std::string, at::Tensor> state;
  for (const auto& item : model.named_parameters()) state.insert(item.key(), item.value().detach().cpu());
  for (const auto& item : model.named_buffers()) state.insert(item.key(), item.value().detach().cpu());
  const auto bytes = torch::pickle_save(c10::IValue(state));
  write_file_atomically(path, std::string(bytes.begin(), bytes.end()));
}

}  // namespace cqk
