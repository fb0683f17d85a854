#include "cqk/batch_source.h"

#include <stdexcept>

#include "cqk/recall_task.h"
#include "cqk/token_loader.h"

namespace cqk {

std::string split_name(Split split) {
  switch (split) {
    case Split::Train: return "train";
    case Split::Valid: return "valid";
    case Split::Test: return "test";
  }
  throw std::invalid_argument("unknown split " + std::to_string(static_cast<int>(split)));
}

std::unique_ptr<BatchSource> make_batch_source(const DataConfig& config, int64_t seed, int rank, int world_size) {
  if (config.kind == DataKind::Recall) return std::make_unique<RecallTask>(config, seed, rank, world_size);
  return std::make_unique<TokenBatchSource>(config, seed, rank, world_size);
}

}  // namespace cqk
