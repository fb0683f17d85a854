#pragma once
// The first steps every run takes, in one order, for `cqk train` and
// `cqk bench train` alike: the config checked, torch's threads, the global
// seed, the batch source (this rank's share), and model.vocab_size from the
// data. What follows (device, model, optimizer) each caller does with the
// trainer's own calls.
#include <memory>
#include <string>

#include "cqk/batch_source.h"
#include "cqk/config.h"

namespace cqk {

struct RunSetup {
  Config config;                        // model.vocab_size resolved from the data
  int threads = 0;                      // what configure_threads set
  std::unique_ptr<BatchSource> source;  // seeded by run.seed
};

RunSetup set_up_run(const Config& config, int rank = 0, int world_size = 1);

// model.vocab_size 0 becomes the data's vocabulary (`data_vocab`, read from
// `data_source`); a vocabulary smaller than the data's throws
// std::invalid_argument naming both. The one home of that rule (train, bench,
// inspect, recall).
void take_vocab_size_from_data(ModelConfig& model, int64_t data_vocab, const std::string& data_source);

}  // namespace cqk
