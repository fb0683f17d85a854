#pragma once
// cqk's model config as JSON under config.yaml's own key names: the model
// section of `cqk bench train`'s config.json and of `cqk export`'s config.json.
// Written from the config's key table (config_loader.cpp), so a new key
// appears here without being listed.
#include <nlohmann/json.hpp>

#include "cqk/config.h"

namespace cqk {

nlohmann::json model_config_json(const ModelConfig& model);

}  // namespace cqk
