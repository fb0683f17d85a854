#include "cqk/sweep_results.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <stdexcept>
#include <tuple>

namespace cqk::sweep {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Reads one field, with an error that names the key (nlohmann's type errors
// do not). Without a fallback the field is required.
template <typename T>
T field(const json& object, const char* key, bool (json::*has_type)() const noexcept, const char* type,
        std::optional<T> fallback = std::nullopt) {
  const auto it = object.find(key);
  if (it == object.end()) {
    if (fallback) return *fallback;
    throw std::runtime_error(std::string("missing \"") + key + "\"");
  }
  if (!((*it).*has_type)()) {
    throw std::runtime_error(std::string("\"") + key + "\" must be " + type + ", not " + it->type_name());
  }
  return it->get<T>();
}

// Where each metric lives in results.json.
struct MetricField {
  Metric metric;
  const char* name;
  std::vector<const char*> path;
};

const std::vector<MetricField>& metric_fields() {
  static const std::vector<MetricField> fields = {
      {Metric::valid_ppl, "valid_ppl", {"valid_ppl"}},
      {Metric::test_ppl, "test_ppl", {"test_ppl"}},
      {Metric::valid_bpb, "valid_bpb", {"valid", "bpb"}},
      {Metric::test_bpb, "test_bpb", {"test", "bpb"}},
      {Metric::valid_word_ppl, "valid_word_ppl", {"valid", "word_ppl"}},
      {Metric::test_word_ppl, "test_word_ppl", {"test", "word_ppl"}},
      {Metric::valid_seen_loss, "valid_seen_loss", {"valid", "seen", "loss"}},
      {Metric::test_seen_loss, "test_seen_loss", {"test", "seen", "loss"}},
  };
  return fields;
}

const MetricField& metric_field(Metric metric) {
  for (const auto& f : metric_fields())
    if (f.metric == metric) return f;
  throw std::invalid_argument("unknown metric " + std::to_string(static_cast<int>(metric)));
}

// A metric's value at its path, absent when any key on the way is.
std::optional<double> metric_at(const json& object, const MetricField& field) {
  const json* at = &object;
  std::string where;
  for (const char* key : field.path) {
    where += (where.empty() ? "" : ".") + std::string(key);
    if (!at->is_object()) throw std::runtime_error("\"" + where + "\" is inside a " + at->type_name() + ", not an object");
    const auto it = at->find(key);
    if (it == at->end()) return std::nullopt;
    at = &*it;
  }
  if (!at->is_number()) throw std::runtime_error("\"" + where + "\" must be a number, not " + at->type_name());
  return at->get<double>();
}

RunResult parse_result(const json& j, const fs::path& dir) {
  if (!j.is_object()) throw std::runtime_error(std::string("expected a JSON object, not ") + j.type_name());
  RunResult r;
  r.dir = dir;
  r.name = field<std::string>(j, "name", &json::is_string, "a string");
  if (r.name.empty()) throw std::runtime_error("\"name\" is empty");
  r.seed = field<long long>(j, "seed", &json::is_number_integer, "an integer");
  for (const auto& f : metric_fields()) {
    const auto value = metric_at(j, f);
    if (value) r.metrics[f.metric] = *value;
    else if (f.metric == Metric::valid_ppl || f.metric == Metric::test_ppl)
      throw std::runtime_error(std::string("missing \"") + f.name + "\"");
  }
  r.steps = field<long long>(j, "steps", &json::is_number_integer, "an integer", 0LL);
  r.params = field<long long>(j, "params", &json::is_number_integer, "an integer", 0LL);
  r.config_hash = field<std::string>(j, "config_hash", &json::is_string, "a string", std::string());
  r.initialisation = field<std::string>(j, "initialisation", &json::is_string, "a string", std::string());
  return r;
}

bool is_run_dir(const fs::path& dir) {
  return fs::is_regular_file(dir / "results.json") || fs::is_regular_file(dir / "metrics.jsonl");
}

// Run directories at `dir` or up to `levels` below it, keyed by canonical path
// so that a run reached through two roots counts once.
void collect_run_dirs(const fs::path& dir, int levels, std::map<fs::path, fs::path>& found) {
  if (is_run_dir(dir)) {
    found.emplace(fs::weakly_canonical(dir), dir);
    return;  // a run's own subfolders (checkpoints) hold no runs
  }
  if (levels == 0) return;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_directory()) collect_run_dirs(entry.path(), levels - 1, found);
  }
}

}  // namespace

RunResult read_run_result(const fs::path& run_dir) {
  const fs::path file = run_dir / "results.json";
  std::ifstream in(file);
  if (!in) throw std::runtime_error(file.string() + ": cannot be read");
  try {
    return parse_result(json::parse(in), run_dir);
  } catch (const std::exception& e) {
    throw std::runtime_error(file.string() + ": " + e.what());
  }
}

SweepRuns find_runs(const std::vector<fs::path>& roots) {
  std::map<fs::path, fs::path> run_dirs;
  for (const auto& root : roots) {
    if (!fs::is_directory(root)) throw std::runtime_error(root.string() + ": not a directory");
    collect_run_dirs(root, 2, run_dirs);
  }
  SweepRuns runs;
  for (const auto& [canonical, dir] : run_dirs) {
    if (fs::is_regular_file(dir / "results.json")) {
      runs.finished.push_back(read_run_result(dir));
    } else {
      runs.unfinished.push_back(dir);
    }
  }
  std::sort(runs.finished.begin(), runs.finished.end(), [](const RunResult& a, const RunResult& b) {
    return std::tie(a.name, a.seed, a.dir) < std::tie(b.name, b.seed, b.dir);
  });
  return runs;
}

std::map<std::string, std::vector<RunResult>> group_by_variant(const std::vector<RunResult>& runs) {
  std::map<std::string, std::vector<RunResult>> groups;
  for (const auto& run : runs) groups[run.name].push_back(run);
  return groups;
}

Metric parse_metric(const std::string& name) {
  std::string names;
  for (const auto& f : metric_fields()) {
    if (name == f.name) return f.metric;
    names += (names.empty() ? "" : ", ") + std::string(f.name);
  }
  throw std::invalid_argument("unknown metric '" + name + "' (expected " + names + ")");
}

const char* metric_name(Metric metric) { return metric_field(metric).name; }

std::optional<double> metric_value(const RunResult& run, Metric metric) {
  const auto it = run.metrics.find(metric);
  if (it == run.metrics.end()) return std::nullopt;
  return it->second;
}

std::vector<double> metric_values(const std::vector<RunResult>& runs, Metric metric) {
  std::vector<double> values;
  values.reserve(runs.size());
  for (const auto& run : runs)
    if (const auto value = metric_value(run, metric)) values.push_back(*value);
  return values;
}

std::optional<std::string> coupling_base(const std::string& variant) {
  for (const std::string marker : {"-affine", "+affine", "-coupled"}) {
    // pos > 0: a name that is only a marker has no base.
    for (auto pos = variant.find(marker, 1); pos != std::string::npos; pos = variant.find(marker, pos + 1)) {
      const auto end = pos + marker.size();
      if (end == variant.size() || variant[end] == '-') return variant.substr(0, pos) + variant.substr(end);
    }
  }
  return std::nullopt;
}

std::vector<std::pair<std::string, std::string>> automatic_pairs(const std::vector<std::string>& variants) {
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const auto& variant : variants) {
    const auto base = coupling_base(variant);
    if (base && std::find(variants.begin(), variants.end(), *base) != variants.end()) pairs.emplace_back(variant, *base);
  }
  return pairs;
}

}  // namespace cqk::sweep
