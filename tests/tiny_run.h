#pragma once
// The config of the tests that train a whole run: a 2-layer model on the
// recall task, 12 steps with an evaluation every 4 and a checkpoint every 2,
// so a run has evaluations, checkpoints to resume from and one to corrupt,
// in well under a second on one thread.
#include <string>
#include <vector>

#include "cqk/config.h"

namespace cqk::testing {

// The embedded default with the tiny settings, named "tiny", then `extra` (key=value) on top.
cqk::Config tiny_run_config(const std::vector<std::string>& extra = {});

}  // namespace cqk::testing
