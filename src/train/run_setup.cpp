#include "train/run_setup.h"

#include <ATen/Context.h>

#include <filesystem>
#include <stdexcept>

#include "cqk/config_loader.h"
#include "cqk/runtime.h"

namespace cqk {

void take_vocab_size_from_data(ModelConfig& model, int64_t data_vocab, const std::string& data_source) {
  if (model.vocab_size == 0) model.vocab_size = data_vocab;
  if (data_vocab > 0 && model.vocab_size < data_vocab)
    throw std::invalid_argument("model.vocab_size (" + std::to_string(model.vocab_size) +
                                ") is smaller than the data's vocabulary (" + std::to_string(data_vocab) + ") of " +
                                data_source);
}

RunSetup set_up_run(const Config& config, int rank, int world_size) {
  RunSetup setup{config, 0, nullptr};
  validate(setup.config);
  setup.threads = configure_threads(static_cast<int>(setup.config.train.threads));
  at::manual_seed(static_cast<uint64_t>(setup.config.run.seed));
  setup.source = make_batch_source(setup.config.data, setup.config.run.seed, rank, world_size);
  const auto& data = setup.config.data;
  take_vocab_size_from_data(setup.config.model, setup.source->vocab_size(),
                            data.kind == DataKind::Recall ? "data.recall.vocab_size"
                                                  : (std::filesystem::path(data.dir) / "train.bin").string());
  return setup;
}

}  // namespace cqk
