#pragma once
// cqk's config as JSON under config.yaml's own key names: the model section of
// `cqk export`'s config.json, the whole config in `cqk bench train`'s.
// Written from the config's key table (config_loader.cpp), so a new key
// appears here without being listed.
#include <nlohmann/json.hpp>

#include "cqk/config.h"

namespace cqk {

nlohmann::json model_config_json(const ModelConfig& model);

// The whole config, every section, in the same way (`cqk bench train`'s config.json).
nlohmann::json config_json(const Config& config);

}  // namespace cqk
