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

// The metrics `cqk stats` can compare, named EVALUATION_MEASURE; lower is
// better for each. EVALUATION is one of the run's final evaluations in
// results.json (valid, test) or an evaluation saved with `cqk eval --save
// NAME` (RUN/evals/NAME.json, e.g. out-of-domain text); MEASURE is ppl, bpb
// (text data), word_ppl (text with word counts), seen_loss (the loss over
// targets seen in training) or error (1 - accuracy): valid_ppl, test_bpb,
// wt2_seen_loss, test_error, ...

// A file in RUN/evals/ that read_run_result left out, and why.
struct IgnoredEvaluation {
  std::filesystem::path file;
  std::string why;  // "of step 50, not the run's final step 100 (results.json)", ...
};

// What a saved evaluation evaluated, as its file records it; fields an older
// file lacks stay empty or 0.
struct SavedEvaluationSource {
  std::filesystem::path file;
  std::string split;     // valid or test
  std::string data;      // the folder as `cqk eval --data` was given it, or the run's own
  long long bytes = 0;   // UTF-8 bytes of the targets (text data)
  long long tokens = 0;  // targets
};

struct RunResult {
  std::filesystem::path dir;
  std::string name;
  long long seed = 0;
  long long steps = 0;
  std::map<std::string, double> metrics;  // by metric name: always valid_ppl and test_ppl
  long long params = 0;
  std::string config_hash;
  std::string initialisation;  // kNameKeyedInitialisation, or empty for older runs
  // Files in RUN/evals/ left out: not of the run's final step, or not named as a saved evaluation.
  std::vector<IgnoredEvaluation> ignored_evaluations;
  std::map<std::string, SavedEvaluationSource> saved_evaluations;  // the ones used, by name
};

// RUN/diverged.json: the trainer writes it when the training loss becomes
// non-finite (the last good checkpoint is kept), and a run that starts again
// in the folder removes it. `cqk stats` names these runs: left out silently,
// they would make a comparison one of the runs that survived.
struct Divergence {
  std::string name;
  long long seed = 0;
  long long step = 0;            // the step whose loss was not finite
  std::string loss;              // "nan", "inf" or "-inf"
  std::string first_non_finite;  // "parameter NAME", "gradient of NAME", or the loss only
};

std::filesystem::path divergence_path(const std::filesystem::path& run_dir);
void write_divergence(const std::filesystem::path& run_dir, const Divergence& divergence);
// Nothing without the file; throws std::runtime_error naming a malformed one.
std::optional<Divergence> read_divergence(const std::filesystem::path& run_dir);

struct UnfinishedRun {
  std::filesystem::path dir;
  std::optional<Divergence> diverged;
};

struct SweepRuns {
  std::vector<RunResult> finished;      // sorted by name, then seed
  std::vector<UnfinishedRun> unfinished;  // run directories without results.json
};

// Reads `run_dir`/results.json, then the evaluations saved in `run_dir`/evals/
// (their metrics count when they evaluated the run's final step). name, seed,
// valid_ppl and test_ppl are required; steps, params, config_hash,
// initialisation and the other metrics are optional.
// Throws std::runtime_error naming the file and the JSON error (or the field)
// when one is malformed.
RunResult read_run_result(const std::filesystem::path& run_dir);

// Where `cqk eval --save NAME` keeps an evaluation: RUN/evals/NAME.json, the
// checkpoint's "step" and evaluation_report.h's evaluation_json, of a whole
// split. A new run in the folder (not a resume) removes the folder.
std::filesystem::path saved_evaluations_folder(const std::filesystem::path& run_dir);
std::filesystem::path saved_evaluation_path(const std::filesystem::path& run_dir, const std::string& name);
// A saved evaluation's name: lowercase letters, digits and '-', starting with
// a letter or digit, and not valid or test. std::invalid_argument otherwise.
void check_evaluation_name(const std::string& name);

// A directory is a run directory when it holds results.json or metrics.jsonl.
// Each root is either a run directory or a folder whose run directories lie one
// or two levels below it (sweep/run or sweep/variant/run). A run reached twice
// counts once. Throws std::runtime_error for a root that is not a directory.
SweepRuns find_runs(const std::vector<std::filesystem::path>& roots);

// A saved evaluation's NAME stands for one text in every run. Removes, from
// every run, each NAME that two runs evaluated on another split or another
// amount of text (bytes, or targets where bytes are not recorded), with its
// metrics, and returns why, by NAME, naming the two files.
std::map<std::string, std::string> drop_disagreeing_saved_evaluations(std::vector<RunResult>& runs);

// Finished runs grouped by variant name (map order: sorted by name).
std::map<std::string, std::vector<RunResult>> group_by_variant(const std::vector<RunResult>& runs);

// A metric's EVALUATION (the part before its first '_'), and whether that is
// one of results.json's own (valid, test) rather than a saved evaluation.
std::string metric_evaluation(const std::string& metric);
bool is_run_evaluation(const std::string& evaluation);
// EVALUATION_MEASURE with one of the measures above and an evaluation name
// check_evaluation_name accepts (or valid, test); std::invalid_argument
// saying what is expected otherwise.
void check_metric_name(const std::string& name);
// The metrics some of `runs` have: measure by measure (in the order above),
// valid and test, then the saved evaluations by name.
std::vector<std::string> reported_metrics(const std::vector<RunResult>& runs);
std::optional<double> metric_value(const RunResult& run, const std::string& metric);
// The values of the runs that have the metric (all runs for valid_ppl, test_ppl).
std::vector<double> metric_values(const std::vector<RunResult>& runs, const std::string& metric);

// The uncoupled base of a coupled variant: the name with its first coupling
// marker ("-affine", "+affine" or "-coupled", ending the name or followed by
// '-') removed: "diff-affine-150m" -> "diff-150m", "mta+affine" -> "mta".
// Empty when the name carries no marker.
std::optional<std::string> coupling_base(const std::string& variant);

// (variant, base) for every variant whose coupling_base is also among `variants`.
std::vector<std::pair<std::string, std::string>> automatic_pairs(const std::vector<std::string>& variants);

}  // namespace cqk::sweep
