#include "tiny_run.h"

#include "cqk/config_loader.h"

namespace cqk::testing {

cqk::Config tiny_run_config(const std::vector<std::string>& extra) {
  std::vector<std::string> overrides = {
      "model.width=32",           "model.layers=2",         "model.heads=4",
      "data.seq_len=16",          "data.batch_size=4",      "data.recall.vocab_size=32",
      "data.recall.pairs=2",      "data.recall.train_examples=200", "data.recall.eval_examples=16",
      "train.steps=12",           "train.warmup_steps=2",   "train.eval_every=4",
      "train.eval_batches=2",     "train.log_every=2",      "train.checkpoint_every=2",
      "train.keep_checkpoints=2", "train.threads=1",        "train.device=cpu",
      "run.name=tiny"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return cqk::default_config(overrides);
}

}  // namespace cqk::testing
