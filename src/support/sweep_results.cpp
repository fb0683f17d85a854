#include "cqk/sweep_results.h"

#include "cqk/atomic_file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>
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

// Each measure's place in an evaluation object (evaluation_report.h's
// evaluation_json), in the order the tables list them.
struct Measure {
  const char* name;
  std::vector<const char*> path;
  bool complement = false;  // the measure is 1 - the number there, so that lower is better for every measure
};

const std::vector<Measure>& measures() {
  static const std::vector<Measure> table = {{"ppl", {"ppl"}},
                                             {"bpb", {"bpb"}},
                                             {"word_ppl", {"word_ppl"}},
                                             {"seen_loss", {"seen", "loss"}},
                                             {"error", {"accuracy"}, true}};
  return table;
}

// results.json's own evaluations, before the saved ones.
constexpr const char* kRunEvaluations[] = {"valid", "test"};

// Why `name` cannot name a saved evaluation; nothing when it can.
std::optional<std::string> evaluation_name_problem(const std::string& name) {
  const bool well_formed = !name.empty() && name.front() != '-' &&
                           std::all_of(name.begin(), name.end(), [](char c) {
                             return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
                           });
  if (!well_formed)
    return "evaluation name '" + name + "': expected lowercase letters, digits and '-', starting with a letter or digit";
  if (is_run_evaluation(name)) return "evaluation name '" + name + "' is the run's own split of that name";
  return std::nullopt;
}

std::string joined_name(const std::string& evaluation, const Measure& measure) {
  return evaluation + "_" + measure.name;
}

// The number at `path` inside `object`, absent when any key on the way is;
// errors name the keys from `prefix` on ("test.seen.loss").
std::optional<double> number_at(const json& object, const std::vector<const char*>& path, const std::string& prefix) {
  const json* at = &object;
  std::string where = prefix;
  for (const char* key : path) {
    if (!at->is_object()) throw std::runtime_error("\"" + where + "\" is a " + at->type_name() + ", not an object");
    where += (where.empty() ? "" : ".") + std::string(key);
    const auto it = at->find(key);
    if (it == at->end()) return std::nullopt;
    at = &*it;
  }
  if (!at->is_number()) throw std::runtime_error("\"" + where + "\" must be a number, not " + at->type_name());
  return at->get<double>();
}

// `measure` of an evaluation object, absent when the object lacks it.
std::optional<double> measure_value(const json& evaluation, const Measure& measure, const std::string& prefix) {
  const auto value = number_at(evaluation, measure.path, prefix);
  if (value && measure.complement) return 1.0 - *value;
  return value;
}

RunResult parse_result(const json& j, const fs::path& dir) {
  if (!j.is_object()) throw std::runtime_error(std::string("expected a JSON object, not ") + j.type_name());
  RunResult r;
  r.dir = dir;
  r.name = field<std::string>(j, "name", &json::is_string, "a string");
  if (r.name.empty()) throw std::runtime_error("\"name\" is empty");
  r.seed = field<long long>(j, "seed", &json::is_number_integer, "an integer");
  for (const char* evaluation : kRunEvaluations) {
    // The perplexity is top-level (valid_ppl) and required; the rest are in the split's object.
    const std::string ppl = joined_name(evaluation, measures().front());
    const auto value = number_at(j, {ppl.c_str()}, "");
    if (!value) throw std::runtime_error("missing \"" + ppl + "\"");
    r.metrics[ppl] = *value;
    const auto split = j.find(evaluation);
    if (split == j.end()) continue;
    if (!split->is_object())
      throw std::runtime_error(std::string("\"") + evaluation + "\" must be an object, not " + split->type_name());
    for (auto m = measures().begin() + 1; m != measures().end(); ++m)
      if (const auto v = measure_value(*split, *m, evaluation)) r.metrics[joined_name(evaluation, *m)] = *v;
  }
  r.steps = field<long long>(j, "steps", &json::is_number_integer, "an integer", 0LL);
  r.params = field<long long>(j, "params", &json::is_number_integer, "an integer", 0LL);
  r.config_hash = field<std::string>(j, "config_hash", &json::is_string, "a string", std::string());
  r.initialisation = field<std::string>(j, "initialisation", &json::is_string, "a string", std::string());
  return r;
}

json read_json(const fs::path& file) {
  std::ifstream in(file);
  if (!in) throw std::runtime_error(file.string() + ": cannot be read");
  try {
    return json::parse(in);
  } catch (const std::exception& e) {
    throw std::runtime_error(file.string() + ": " + e.what());
  }
}

// Adds the metrics of RUN/evals/*.json that evaluated the run's final step;
// notes the files it leaves out. A malformed file of a saved evaluation's name
// is an error, as a malformed results.json is.
void read_saved_evaluations(RunResult& r) {
  const fs::path folder = saved_evaluations_folder(r.dir);
  if (!fs::is_directory(folder)) return;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(folder))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    const std::string name = file.stem().string();
    if (const auto problem = evaluation_name_problem(name)) {
      r.ignored_evaluations.push_back({file, "not a saved evaluation (" + *problem + ")"});
      continue;
    }
    const json j = read_json(file);
    try {
      if (!j.is_object()) throw std::runtime_error(std::string("expected a JSON object, not ") + j.type_name());
      const auto step = field<long long>(j, "step", &json::is_number_integer, "an integer");
      if (r.steps == 0) {
        r.ignored_evaluations.push_back({file, "results.json records no final step to check it against"});
        continue;
      }
      if (step != r.steps) {
        r.ignored_evaluations.push_back({file, "of step " + std::to_string(step) + ", not the run's final step " +
                                                   std::to_string(r.steps) + " (results.json)"});
        continue;
      }
      for (const auto& m : measures())
        if (const auto v = measure_value(j, m, "")) r.metrics[joined_name(name, m)] = *v;
      r.saved_evaluations[name] = {file, field<std::string>(j, "split", &json::is_string, "a string", std::string()),
                                   field<std::string>(j, "data", &json::is_string, "a string", std::string()),
                                   field<long long>(j, "bytes", &json::is_number_integer, "an integer", 0LL),
                                   field<long long>(j, "tokens", &json::is_number_integer, "an integer", 0LL)};
    } catch (const std::exception& e) {
      throw std::runtime_error(file.string() + ": " + e.what());
    }
  }
}

// A run that diverged before its first metrics line has only diverged.json to show for it.
bool is_run_dir(const fs::path& dir) {
  return fs::is_regular_file(dir / "results.json") || fs::is_regular_file(dir / "metrics.jsonl") ||
         fs::is_regular_file(divergence_path(dir));
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

// Why a and b are not evaluations of one text; nothing when they may be (a
// field either file lacks is not compared).
std::optional<std::string> source_difference(const SavedEvaluationSource& a, const SavedEvaluationSource& b) {
  if (!a.split.empty() && !b.split.empty() && a.split != b.split) return "split";
  if (a.bytes > 0 && b.bytes > 0) {
    if (a.bytes != b.bytes) return "bytes";
  } else if (a.tokens > 0 && b.tokens > 0 && a.tokens != b.tokens) {
    return "tokens";
  }
  return std::nullopt;
}

std::string describe_source(const SavedEvaluationSource& s) {
  const std::string amount = s.bytes > 0    ? std::to_string(s.bytes) + " bytes"
                             : s.tokens > 0 ? std::to_string(s.tokens) + " tokens"
                                            : "size not recorded";
  return s.file.string() + " (" + (s.split.empty() ? "split not recorded" : s.split) + " of " +
         (s.data.empty() ? "data not recorded" : s.data) + ", " + amount + ")";
}

}  // namespace

RunResult read_run_result(const fs::path& run_dir) {
  const fs::path file = run_dir / "results.json";
  const json j = read_json(file);
  RunResult r;
  try {
    r = parse_result(j, run_dir);
  } catch (const std::exception& e) {
    throw std::runtime_error(file.string() + ": " + e.what());
  }
  read_saved_evaluations(r);
  return r;
}

fs::path divergence_path(const fs::path& run_dir) { return run_dir / "diverged.json"; }

void write_divergence(const fs::path& run_dir, const Divergence& d) {
  const json j = {{"name", d.name},
                  {"seed", d.seed},
                  {"step", d.step},
                  {"loss", d.loss},
                  {"first_non_finite", d.first_non_finite}};
  write_file_atomically(divergence_path(run_dir).string(), j.dump(2) + "\n");
}

std::optional<Divergence> read_divergence(const fs::path& run_dir) {
  const fs::path file = divergence_path(run_dir);
  if (!fs::exists(file)) return std::nullopt;
  const json j = read_json(file);
  try {
    if (!j.is_object()) throw std::runtime_error(std::string("expected a JSON object, not ") + j.type_name());
    return Divergence{field<std::string>(j, "name", &json::is_string, "a string"),
                      field<long long>(j, "seed", &json::is_number_integer, "an integer"),
                      field<long long>(j, "step", &json::is_number_integer, "an integer"),
                      field<std::string>(j, "loss", &json::is_string, "a string"),
                      field<std::string>(j, "first_non_finite", &json::is_string, "a string")};
  } catch (const std::exception& e) {
    throw std::runtime_error(file.string() + ": " + e.what());
  }
}

fs::path saved_evaluations_folder(const fs::path& run_dir) { return run_dir / "evals"; }

fs::path saved_evaluation_path(const fs::path& run_dir, const std::string& name) {
  return saved_evaluations_folder(run_dir) / (name + ".json");
}

void check_evaluation_name(const std::string& name) {
  if (const auto problem = evaluation_name_problem(name)) throw std::invalid_argument(*problem);
}

std::string metric_evaluation(const std::string& metric) { return metric.substr(0, metric.find('_')); }

bool is_run_evaluation(const std::string& evaluation) {
  return std::find(std::begin(kRunEvaluations), std::end(kRunEvaluations), evaluation) != std::end(kRunEvaluations);
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
      runs.unfinished.push_back({dir, read_divergence(dir)});
    }
  }
  std::sort(runs.finished.begin(), runs.finished.end(), [](const RunResult& a, const RunResult& b) {
    return std::tie(a.name, a.seed, a.dir) < std::tie(b.name, b.seed, b.dir);
  });
  return runs;
}

std::map<std::string, std::string> drop_disagreeing_saved_evaluations(std::vector<RunResult>& runs) {
  // Every pair, not each against the first: an older file that records no
  // split or size agrees with anything, and must not hide two that disagree.
  std::map<std::string, std::vector<const SavedEvaluationSource*>> seen;
  std::map<std::string, std::string> why;
  for (const auto& run : runs) {
    for (const auto& [name, source] : run.saved_evaluations) {
      auto& earlier = seen[name];
      for (const auto* other : earlier) {
        const auto field = source_difference(*other, source);
        if (field && !why.count(name))
          why[name] = "saved evaluation '" + name + "' differs in " + *field + " between runs: " +
                      describe_source(*other) + " and " + describe_source(source) +
                      "; save one NAME from one folder and split for every run";
      }
      earlier.push_back(&source);
    }
  }
  for (auto& run : runs) {
    for (const auto& [name, reason] : why) {
      run.saved_evaluations.erase(name);
      for (auto it = run.metrics.begin(); it != run.metrics.end();)
        it = metric_evaluation(it->first) == name ? run.metrics.erase(it) : std::next(it);
    }
  }
  return why;
}

std::map<std::string, std::vector<RunResult>> group_by_variant(const std::vector<RunResult>& runs) {
  std::map<std::string, std::vector<RunResult>> groups;
  for (const auto& run : runs) groups[run.name].push_back(run);
  return groups;
}

void check_metric_name(const std::string& name) {
  const std::string evaluation = metric_evaluation(name);
  const std::string measure = name.size() > evaluation.size() ? name.substr(evaluation.size() + 1) : "";
  const bool known_evaluation = is_run_evaluation(evaluation) || !evaluation_name_problem(evaluation);
  std::string names;
  bool known_measure = false;
  for (const auto& m : measures()) {
    known_measure = known_measure || measure == m.name;
    names += (names.empty() ? "" : ", ") + std::string(m.name);
  }
  if (!known_evaluation || !known_measure)
    throw std::invalid_argument("unknown metric '" + name +
                                "' (expected EVALUATION_MEASURE: EVALUATION valid, test or the NAME of `cqk eval "
                                "--save NAME`; MEASURE one of " + names + ")");
}

std::vector<std::string> reported_metrics(const std::vector<RunResult>& runs) {
  std::vector<std::string> evaluations(std::begin(kRunEvaluations), std::end(kRunEvaluations));
  std::set<std::string> saved, present;
  for (const auto& run : runs) {
    for (const auto& [metric, value] : run.metrics) {
      present.insert(metric);
      if (!is_run_evaluation(metric_evaluation(metric))) saved.insert(metric_evaluation(metric));
    }
  }
  evaluations.insert(evaluations.end(), saved.begin(), saved.end());
  std::vector<std::string> metrics;
  for (const auto& m : measures())
    for (const auto& evaluation : evaluations)
      if (present.count(joined_name(evaluation, m))) metrics.push_back(joined_name(evaluation, m));
  return metrics;
}

std::optional<double> metric_value(const RunResult& run, const std::string& metric) {
  const auto it = run.metrics.find(metric);
  if (it == run.metrics.end()) return std::nullopt;
  return it->second;
}

std::vector<double> metric_values(const std::vector<RunResult>& runs, const std::string& metric) {
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
