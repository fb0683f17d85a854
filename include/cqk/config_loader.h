#pragma once
// Loading, checking and writing the experiment configuration (cqk/config.h).
//
//   cqk::Config c = cqk::load_config("configs/tiny/recall-affine.yaml", {"train.lr=1e-3"});
//
// A config file is YAML with the sections of Config (run, model, data, train);
// every key is optional and defaults to the struct's value. `inherit: base.yaml`
// at the top level (relative to the including file; chains allowed) loads a base
// first, and the file's own keys deep-merge over it. Overrides `key.path=value`
// (the value parsed as YAML) apply last. Every error is a ConfigError whose
// message is one line naming the source (file, "--set", "<resolved config>")
// and the full key path, e.g.
//   configs/x.yaml: model.attention.coupling.kind: expected one of
//   none|affine|noninvertible|uncoupled|dynamics, got 'afine' (line 7)
#include <stdexcept>
#include <string>
#include <vector>

#include "cqk/config.h"

namespace cqk {

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Loads `path` (following `inherit:`), applies `overrides`, then validates.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// The same from YAML text; `source_name` names it in errors, and a relative
// `inherit:` is resolved against its folder.
Config load_config_string(const std::string& yaml, const std::string& source_name,
                          const std::vector<std::string>& overrides = {});

// configs/default.yaml as built into the library (source "<embedded default>").
Config default_config(const std::vector<std::string>& overrides = {});
const std::string& default_config_yaml();

// Applies `key.path=value` overrides in order (source "--set"); does not validate.
void apply_overrides(Config& config, const std::vector<std::string>& overrides);

// Range and consistency checks; throws ConfigError with source "<resolved config>".
void validate(const Config& config);

// Every field, fully resolved, as YAML that load_config_string reads back to an
// equal Config.
std::string to_yaml(const Config& config);

// 16 hex digits (FNV-1a 64 of to_yaml): equal configs give equal hashes.
std::string config_hash(const Config& config);

// The hash of a run folder's config.yaml as written: the config_hash its
// checkpoints carry, also after a newer cqk added keys (with defaults) that
// would change to_yaml of the same config read back.
std::string stored_config_hash(const std::string& run_dir);

// Every leaf key path ("model.attention.coupling.kind", ...), in file order.
std::vector<std::string> config_keys();

}  // namespace cqk
