#pragma once
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

// The finished runs of a sweep, read from run directories. A run directory
// holds metrics.jsonl while training and results.json once it has finished:
//   {"name": "diff-affine-150m", "seed": 3, "steps": 1000, "valid_ppl": 21.3,
//    "test_ppl": 22.1, "params": 150123456, "config_hash": "...", "initialisation": "name-keyed",
//    "valid": {"bpb": 1.02, "word_ppl": 30.1, "seen": {"loss": 3.0, ...}, ...}, "test": {...}}
// (evaluation_report.h writes "valid" and "test"). Runs of one variant share a
// name and differ in seed.
namespace cqk::sweep {

// results.json's "initialisation" of a run whose parameters were initialised
// keyed by (seed, name) (src/model/initialisation.h): runs of one seed that
// differ only by the coupling start from the same weights, so `cqk stats`
// pairs them by seed. Runs without it are compared unpaired.
inline constexpr char kNameKeyedInitialisation[] = "name-keyed";

// The metrics `cqk stats` can compare; lower is better for each. Named as in
// metrics.jsonl: valid_ppl and test_ppl (results.json's top-level keys), then
// from results.json's "valid"/"test" objects: bpb (text data), word_ppl (text
// with word counts) and seen.loss (the loss over targets seen in training).
enum class Metric { valid_ppl, test_ppl, valid_bpb, test_bpb, valid_word_ppl, test_word_ppl, valid_seen_loss, test_seen_loss };
inline constexpr Metric kMetrics[] = {Metric::valid_ppl,      Metric::test_ppl,      Metric::valid_bpb,
                                      Metric::test_bpb,       Metric::valid_word_ppl, Metric::test_word_ppl,
                                      Metric::valid_seen_loss, Metric::test_seen_loss};

struct RunResult {
  std::filesystem::path dir;
  std::string name;
  long long seed = 0;
  long long steps = 0;
  std::map<Metric, double> metrics;  // those results.json holds; always valid_ppl and test_ppl
  long long params = 0;
  std::string config_hash;
  std::string initialisation;  // kNameKeyedInitialisation, or empty for older runs
};

struct SweepRuns {
  std::vector<RunResult> finished;              // sorted by name, then seed
  std::vector<std::filesystem::path> unfinished;  // run directories without results.json
};

// Reads `run_dir`/results.json. name, seed, valid_ppl and test_ppl are
// required; steps, params, config_hash, initialisation and the other metrics
// are optional.
// Throws std::runtime_error naming the file and the JSON error (or the field)
// when it is malformed.
RunResult read_run_result(const std::filesystem::path& run_dir);

// A directory is a run directory when it holds results.json or metrics.jsonl.
// Each root is either a run directory or a folder whose run directories lie one
// or two levels below it (sweep/run or sweep/variant/run). A run reached twice
// counts once. Throws std::runtime_error for a root that is not a directory.
SweepRuns find_runs(const std::vector<std::filesystem::path>& roots);

// Finished runs grouped by variant name (map order: sorted by name).
std::map<std::string, std::vector<RunResult>> group_by_variant(const std::vector<RunResult>& runs);

// "valid_ppl", "test_bpb", ...: std::invalid_argument listing the names otherwise.
Metric parse_metric(const std::string& name);
const char* metric_name(Metric metric);
std::optional<double> metric_value(const RunResult& run, Metric metric);
// The values of the runs that have the metric (all runs for valid_ppl, test_ppl).
std::vector<double> metric_values(const std::vector<RunResult>& runs, Metric metric);

// The uncoupled base of a coupled variant: the name with its first coupling
// marker ("-affine", "+affine" or "-coupled", ending the name or followed by
// '-') removed: "diff-affine-150m" -> "diff-150m", "mta+affine" -> "mta".
// Empty when the name carries no marker.
std::optional<std::string> coupling_base(const std::string& variant);

// (variant, base) for every variant whose coupling_base is also among `variants`.
std::vector<std::pair<std::string, std::string>> automatic_pairs(const std::vector<std::string>& variants);

}  // namespace cqk::sweep
