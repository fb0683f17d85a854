#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"
#include "cqk/atomic_file.h"
#include "cqk/log.h"
#include "cqk/statistics.h"
#include "cqk/sweep_results.h"
#include "support/printf_number.h"

namespace cqk::cli {
namespace {

namespace fs = std::filesystem;
using Groups = std::map<std::string, std::vector<sweep::RunResult>>;
using Pair = std::pair<std::string, std::string>;  // (variant, base)

constexpr double kAlpha = 0.05;
constexpr double kPower = 0.8;  // of the minimum detectable difference

struct StatsOptions {
  std::vector<std::string> run_dirs;
  std::vector<std::string> compare;
  std::string metric = "valid_ppl";
  std::string csv;
  std::string markdown;
  bool unpaired = false;  // Welch only, even where the runs are paired
};

// A paired comparison: the seeds both variants ran, each variant's value minus
// the base's of the same seed.
struct Paired {
  std::vector<long long> seeds;
  std::vector<double> differences;
  std::vector<long long> left_out;  // seeds only one side has
  stats::PairedResult test;
  stats::SignedRankResult signed_rank;  // the same pairs without assuming normal differences
  double minimum_detectable = 0;  // |Δ| detected with power kPower at two-sided kAlpha
  double welch_half_width = 0;    // the unpaired CI's half-width on the same seeds, for comparison
  double p_bonferroni = 0;        // of the one-sided p (variant better), over the call's comparisons
};

struct Comparison {
  std::string variant, base;
  std::size_t n_variant = 0, n_base = 0;
  double mean_difference = 0;  // variant - base: negative means the variant reaches a lower (better) value
  stats::WelchResult welch;
  double hedges_g = 0;
  double p_bonferroni = 0;  // of the one-sided p (variant better), over all comparisons
  std::optional<Paired> paired;  // when both variants' runs were initialised keyed by name (and not --unpaired)
  std::string paired_note;       // why a pairable comparison has no paired test
};

struct Report {
  std::string metric;
  Groups groups;
  std::vector<std::string> reported_metrics;  // those some finished run has (sweep::reported_metrics)
  std::vector<sweep::UnfinishedRun> unfinished;
  std::vector<Comparison> comparisons;
  std::vector<std::string> notes;
};

std::string p_value(double p) { return printf_number(p >= 1e-3 ? "%.4f" : "%.1e", p); }

// "mean ± sd", with the count when only some of the runs have the metric; "-" when none has.
std::string mean_sd(const std::vector<sweep::RunResult>& runs, const std::string& metric) {
  const auto values = sweep::metric_values(runs, metric);
  if (values.empty()) return "-";
  std::string m = printf_number("%.3f", stats::mean(values));
  if (values.size() >= 2) m += " ± " + printf_number("%.3f", stats::sample_sd(values));
  return values.size() < runs.size() ? m + " (n=" + std::to_string(values.size()) + ")" : m;
}

// The metric of every run of a variant; an error names a run without it.
std::vector<double> compared_values(const std::vector<sweep::RunResult>& runs, const std::string& metric) {
  const std::string evaluation = sweep::metric_evaluation(metric);
  for (const auto& run : runs) {
    if (sweep::metric_value(run, metric)) continue;
    if (!sweep::is_run_evaluation(evaluation)) {
      const auto file = sweep::saved_evaluation_path(run.dir, evaluation);
      const bool ignored = std::any_of(run.ignored_evaluations.begin(), run.ignored_evaluations.end(),
                                       [&](const sweep::IgnoredEvaluation& e) { return e.file == file; });
      const std::string why =
          ignored            ? file.string() + " is not of its final step; evaluate it again: `cqk eval " +
                                   run.dir.string() + " --data DIR --save " + evaluation + "`"
          : fs::exists(file) ? file.string() + " lacks it (bpb needs text data, word_ppl a word count)"
                             : "no " + file.string() + ": `cqk eval " + run.dir.string() + " --data DIR --save " +
                                   evaluation + "`";
      throw std::runtime_error(run.dir.string() + " has no " + metric + " (" + why + ")");
    }
    throw std::runtime_error((run.dir / "results.json").string() + " has no " + metric +
                             " (bpb needs text data with its tokenizer.model, word_ppl a word count)");
  }
  return sweep::metric_values(runs, metric);
}

std::string variant_list(const Groups& groups) {
  std::string names;
  for (const auto& [name, runs] : groups) names += (names.empty() ? "" : ", ") + name;
  return names;
}

Pair parse_pair(const std::string& text, const Groups& groups) {
  const auto colon = text.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size() ||
      text.find(':', colon + 1) != std::string::npos) {
    throw std::runtime_error("--compare '" + text + "': expected VARIANT:BASE");
  }
  Pair pair{text.substr(0, colon), text.substr(colon + 1)};
  for (const auto& name : {pair.first, pair.second}) {
    if (!groups.count(name)) {
      throw std::runtime_error("--compare '" + text + "': unknown variant '" + name +
                               "' (finished variants: " + variant_list(groups) + ")");
    }
  }
  return pair;
}

// Explicit pairs must be testable; automatic ones with too few seeds are only noted.
std::vector<Pair> choose_pairs(const StatsOptions& options, Report& report) {
  std::vector<Pair> pairs;
  if (!options.compare.empty()) {
    for (const auto& text : options.compare) pairs.push_back(parse_pair(text, report.groups));
  } else {
    std::vector<std::string> names;
    for (const auto& [name, runs] : report.groups) names.push_back(name);
    pairs = sweep::automatic_pairs(names);
  }
  std::vector<Pair> testable;
  for (const auto& pair : pairs) {
    const auto n = std::min(report.groups.at(pair.first).size(), report.groups.at(pair.second).size());
    if (n >= 2) {
      testable.push_back(pair);
      continue;
    }
    const std::string problem = pair.first + " vs " + pair.second +
                                ": a t-test needs at least 2 finished runs of each variant";
    if (!options.compare.empty()) throw std::runtime_error(problem);
    report.notes.push_back("not compared: " + problem);
  }
  return testable;
}

bool name_keyed(const std::vector<sweep::RunResult>& runs) {
  return std::all_of(runs.begin(), runs.end(),
                     [](const auto& run) { return run.initialisation == sweep::kNameKeyedInitialisation; });
}

// The runs of one seed pair up when both variants initialise keyed by name:
// they then share their starting weights and batches. Nullopt for older runs
// or fewer than two common seeds.
std::optional<Paired> compare_paired(const std::vector<sweep::RunResult>& variant,
                                     const std::vector<sweep::RunResult>& base, const std::string& metric) {
  if (!name_keyed(variant) || !name_keyed(base)) return std::nullopt;
  std::map<long long, double> base_by_seed;
  for (const auto& run : base) base_by_seed[run.seed] = *sweep::metric_value(run, metric);
  Paired p;
  std::vector<double> a, b;
  for (const auto& run : variant) {
    const auto match = base_by_seed.find(run.seed);
    if (match == base_by_seed.end()) {
      p.left_out.push_back(run.seed);
      continue;
    }
    p.seeds.push_back(run.seed);
    a.push_back(*sweep::metric_value(run, metric));
    b.push_back(match->second);
    p.differences.push_back(a.back() - b.back());
    base_by_seed.erase(match);
  }
  for (const auto& [seed, value] : base_by_seed) p.left_out.push_back(seed);
  if (p.seeds.size() < 2) return std::nullopt;
  if (std::all_of(p.differences.begin(), p.differences.end(), [](double d) { return d == 0; }))
    throw std::domain_error("every pair has the same value");
  p.signed_rank = stats::wilcoxon_signed_rank(p.differences);
  try {
    p.test = stats::paired_t_test(a, b, kAlpha);
  } catch (const std::domain_error&) {  // one difference for every pair: no t, but the signs still count
    throw std::domain_error("every pair differs by " + printf_number("%+.6g", p.differences.front()) + "; signed-rank: " +
                            std::to_string(p.signed_rank.negative) + " of " + std::to_string(p.seeds.size()) +
                            " lower, p one-sided " + p_value(p.signed_rank.p_less));
  }
  p.minimum_detectable = stats::minimum_detectable_difference(p.seeds.size(), p.test.sd_difference, kAlpha, kPower);
  const auto welch = stats::welch_t_test(a, b);
  p.welch_half_width = stats::student_t_quantile(1.0 - 0.5 * kAlpha, welch.df) * welch.standard_error;
  return p;
}

// A pair whose runs all have one value per variant: nothing to test, only to note.
struct NoVariance : std::runtime_error {
  using std::runtime_error::runtime_error;
};

Comparison compare(const Groups& groups, const Pair& pair, const std::string& metric, bool unpaired) {
  const auto a = compared_values(groups.at(pair.first), metric);
  const auto b = compared_values(groups.at(pair.second), metric);
  Comparison c;
  c.variant = pair.first;
  c.base = pair.second;
  c.n_variant = a.size();
  c.n_base = b.size();
  try {
    c.mean_difference = stats::mean(a) - stats::mean(b);
    c.welch = stats::welch_t_test(a, b);
    c.hedges_g = stats::hedges_g(a, b);
  } catch (const std::domain_error&) {
    throw NoVariance(pair.first + " vs " + pair.second + ": every run of each has the same " + metric + " (" +
                     printf_number("%.6g", stats::mean(a)) + " and " + printf_number("%.6g", stats::mean(b)) +
                     "), no spread to test a difference against");
  } catch (const std::exception& e) {
    throw std::runtime_error(pair.first + " vs " + pair.second + ": " + e.what());
  }
  if (unpaired) return c;
  try {
    c.paired = compare_paired(groups.at(pair.first), groups.at(pair.second), metric);
    if (!c.paired && name_keyed(groups.at(pair.first)) && name_keyed(groups.at(pair.second)))
      c.paired_note = pair.first + " vs " + pair.second + ": no paired test (fewer than 2 seeds in common)";
  } catch (const std::domain_error& e) {  // every pair differs by the same amount: no paired test, Welch still stands
    c.paired_note = pair.first + " vs " + pair.second + ": no paired test (" + e.what() + ")";
  }
  return c;
}

// The fewest and the most of `field` over runs that report it (> 0), with a run of each.
struct Spread {
  long long least = 0, most = 0;
  std::string least_dir, most_dir;
};

Spread spread(const std::vector<sweep::RunResult>& runs, long long sweep::RunResult::*field) {
  Spread s;
  for (const auto& run : runs) {
    const long long value = run.*field;
    if (value <= 0) continue;
    if (s.least == 0 || value < s.least) s.least = value, s.least_dir = run.dir.string();
    if (value > s.most) s.most = value, s.most_dir = run.dir.string();
  }
  return s;
}

// Unlike runs pooled as one variant (a sweep rerun with another train.steps skips
// the runs it finished before; a changed width keeps the name), and a variant
// compared with a base of another length: the tables then measure more than the variant.
std::vector<std::string> unlike_runs(const Groups& groups, const std::vector<Pair>& pairs) {
  std::vector<std::string> notes;
  for (const auto& [name, runs] : groups) {
    for (const auto& [field, what] : {std::pair{&sweep::RunResult::steps, "steps"},
                                      std::pair{&sweep::RunResult::params, "parameters"}}) {
      const auto s = spread(runs, field);
      if (s.least != s.most)
        notes.push_back(name + " pools unlike runs: " + std::to_string(s.least) + " " + what + " (" + s.least_dir +
                        ") and " + std::to_string(s.most) + " (" + s.most_dir + ")");
    }
  }
  for (const auto& [variant, base] : pairs) {
    const auto v = spread(groups.at(variant), &sweep::RunResult::steps);
    const auto b = spread(groups.at(base), &sweep::RunResult::steps);
    if (v.least > 0 && b.least > 0 && v.least == v.most && b.least == b.most && v.least != b.least)
      notes.push_back(variant + " vs " + base + ": the variant trained " + std::to_string(v.least) +
                      " steps, the base " + std::to_string(b.least));
  }
  return notes;
}

void warn_about_repeated_seeds(const Groups& groups) {
  for (const auto& [name, runs] : groups) {
    for (std::size_t i = 1; i < runs.size(); ++i) {
      if (runs[i].seed == runs[i - 1].seed) {  // runs are sorted by seed within a name
        log::warn("stats: " + name + " has seed " + std::to_string(runs[i].seed) + " more than once (" +
                  runs[i - 1].dir.string() + ", " + runs[i].dir.string() +
                  "); Welch's test counts both, a paired test pairs one of them");
      }
    }
  }
}

// A note per variant with diverged runs: its statistics are of the runs that survived.
std::vector<std::string> diverged_runs(const std::vector<sweep::UnfinishedRun>& unfinished,
                                       const std::vector<sweep::RunResult>& finished) {
  std::map<std::string, std::vector<long long>> seeds;
  for (const auto& run : unfinished)
    if (run.diverged) seeds[run.diverged->name].push_back(run.diverged->seed);
  std::vector<std::string> notes;
  for (auto& [name, list] : seeds) {
    std::sort(list.begin(), list.end());
    std::string text;
    for (const long long seed : list) text += (text.empty() ? "" : ", ") + std::to_string(seed);
    const bool others = std::any_of(finished.begin(), finished.end(),
                                    [&, n = name](const sweep::RunResult& r) { return r.name == n; });
    notes.push_back(name + ": " + std::to_string(list.size()) + " run(s) diverged (seed " + text +
                    ") and are not counted; " +
                    (others ? "its figures are of the runs that finished" : "it has no finished run"));
  }
  return notes;
}

std::string describe_unfinished(const sweep::UnfinishedRun& run) {
  if (!run.diverged) return run.dir.string();
  const auto& d = *run.diverged;
  return run.dir.string() + ": diverged at step " + std::to_string(d.step) + " (loss " + d.loss +
         "; first non-finite: " + d.first_non_finite + ")";
}

Report build_report(const StatsOptions& options) {
  Report report;
  report.metric = options.metric;  // checked by --metric's validator
  auto runs = sweep::find_runs(std::vector<fs::path>(options.run_dirs.begin(), options.run_dirs.end()));
  report.unfinished = runs.unfinished;
  if (runs.finished.empty()) {
    std::string roots;
    for (const auto& dir : options.run_dirs) roots += " " + dir;
    throw std::runtime_error("no results.json found under" + roots + " (each folder and two levels below it; " +
                             "unfinished runs: " + std::to_string(runs.unfinished.size()) + ")");
  }
  // A NAME that means two texts: an error when it is the one compared, else left out of the report.
  for (const auto& [name, why] : sweep::drop_disagreeing_saved_evaluations(runs.finished)) {
    if (sweep::metric_evaluation(report.metric) == name) throw std::runtime_error(why);
    report.notes.push_back("not used: " + why);
  }
  for (const auto& note : diverged_runs(runs.unfinished, runs.finished)) report.notes.push_back(note);
  report.groups = sweep::group_by_variant(runs.finished);
  report.reported_metrics = sweep::reported_metrics(runs.finished);
  for (const auto& run : runs.finished)
    for (const auto& ignored : run.ignored_evaluations)
      report.notes.push_back("not used: " + ignored.file.string() + ": " + ignored.why);
  warn_about_repeated_seeds(report.groups);
  const auto pairs = choose_pairs(options, report);
  for (const auto& note : unlike_runs(report.groups, pairs)) report.notes.push_back(note);
  for (const auto& pair : pairs) {
    try {
      report.comparisons.push_back(compare(report.groups, pair, report.metric, options.unpaired));
    } catch (const NoVariance& e) {
      report.notes.push_back(std::string("not compared: ") + e.what());
      continue;
    }
    if (!report.comparisons.back().paired_note.empty()) report.notes.push_back(report.comparisons.back().paired_note);
  }
  const int m = static_cast<int>(report.comparisons.size());
  for (auto& c : report.comparisons) {
    c.p_bonferroni = stats::bonferroni(c.welch.p_less, m);
    if (c.paired) c.paired->p_bonferroni = stats::bonferroni(c.paired->test.p_less, m);
  }
  return report;
}

std::string seed_differences(const Paired& p) {
  std::string text;
  for (std::size_t i = 0; i < p.seeds.size(); ++i)
    text += (i ? ", " : "") + std::to_string(p.seeds[i]) + ": " + printf_number("%+.4g", p.differences[i]);
  return text;
}

void render_paired_markdown(const Report& report, std::ostringstream& out) {
  const bool any = std::any_of(report.comparisons.begin(), report.comparisons.end(),
                               [](const Comparison& c) { return c.paired.has_value(); });
  if (!any) return;
  const std::string& metric = report.metric;
  out << "\n## Paired comparisons on " << metric << " (paired t-test over seeds)\n\n"
      << "| variant | base | pairs | Δ mean | sd of Δ | t | df | 95% CI | ± paired | ± Welch | p one-sided | "
         "p two-sided | d_z | p Bonferroni | sig | lower | p signed-rank | detectable Δ |\n"
      << "|---|---|--:|--:|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|:-:|--:|--:|--:|\n";
  for (const auto& c : report.comparisons) {
    if (!c.paired) continue;
    const auto& p = *c.paired;
    const auto& t = p.test;
    out << "| " << c.variant << " | " << c.base << " | " << t.pairs << " | "
        << printf_number("%+.4g", t.mean_difference) << " | " << printf_number("%.4g", t.sd_difference) << " | "
        << printf_number("%.3f", t.t) << " | " << printf_number("%.0f", t.df) << " | ["
        << printf_number("%+.4g", t.ci_low) << ", " << printf_number("%+.4g", t.ci_high) << "] | "
        << printf_number("%.4g", 0.5 * (t.ci_high - t.ci_low)) << " | " << printf_number("%.4g", p.welch_half_width)
        << " | " << p_value(t.p_less) << " | " << p_value(t.p_two_sided) << " | " << printf_number("%.3f", t.d_z)
        << " | " << p_value(p.p_bonferroni) << " | " << (p.p_bonferroni < kAlpha ? "*" : "") << " | "
        << p.signed_rank.negative << "/" << t.pairs << " | " << p_value(p.signed_rank.p_less) << " | "
        << printf_number("%.4g", p.minimum_detectable) << " |\n";
  }
  out << "\nPer seed, variant minus base:\n";
  for (const auto& c : report.comparisons) {
    if (!c.paired) continue;
    out << "- " << c.variant << " vs " << c.base << ": " << seed_differences(*c.paired);
    if (!c.paired->left_out.empty()) {
      out << " (left out, one side only: seeds";
      for (const auto seed : c.paired->left_out) out << " " << seed;
      out << ")";
    }
    out << "\n";
  }
  out << "\nRuns initialised keyed by parameter name see the same batches per seed, and a coupled variant and its "
         "base share every initial weight they have in common, so each pair's difference is the coupling's effect plus "
         "its own training noise; for such runs this is the test to read (Welch's above treats them as unpaired). "
         "Δ mean and its 95% CI: "
         "variant - base; ± paired / ± Welch: the CI's half-width paired and unpaired (Welch) on the same runs. "
         "d_z = Δ mean / sd of Δ. p Bonferroni: one-sided p times "
      << report.comparisons.size() << " comparisons. Lower: the pairs where the variant's value is below the base's. "
      << "p signed-rank: Wilcoxon's signed-rank test, one-sided, which does not assume normal differences (where some "
      << "seeds learn a task and others do not, a few dwarf the rest); exact up to " << stats::kSignedRankExactMax
      << " non-zero differences, ties included. Detectable Δ: the smallest true |Δ| a two-sided paired t-test "
      << "at " << kAlpha << " finds with power " << kPower << " for this many pairs and this sd of Δ. "
      << "`--unpaired` leaves this table out.\n";
}

std::string render_markdown(const Report& report) {
  std::ostringstream out;
  std::size_t finished = 0;
  for (const auto& [name, runs] : report.groups) finished += runs.size();
  const auto& metrics = report.reported_metrics;
  out << "## Variants (" << finished << " finished runs)\n\n| variant | n |";
  for (const auto& metric : metrics) out << " " << metric << " mean ± sd |";
  out << "\n|---|--:|";
  for (std::size_t i = 0; i < metrics.size(); ++i) out << "--:|";
  out << "\n";
  for (const auto& [name, runs] : report.groups) {
    out << "| " << name << " | " << runs.size() << " |";
    for (const auto& metric : metrics) out << " " << mean_sd(runs, metric) << " |";
    out << "\n";
  }
  if (!report.unfinished.empty()) {
    out << "\nUnfinished runs (no results.json, not counted):\n";
    for (const auto& run : report.unfinished) out << "- " << describe_unfinished(run) << "\n";
  }
  for (const auto& note : report.notes) out << "\nNote: " << note << "\n";
  if (report.comparisons.empty()) return out.str();

  const std::string& metric = report.metric;
  out << "\n## Comparisons on " << metric << " (Welch's t-test)\n\n"
      << "| variant | base | n | Δ mean | t | df | p one-sided | p two-sided | Hedges' g | p Bonferroni | sig |\n"
      << "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|:-:|\n";
  for (const auto& c : report.comparisons) {
    out << "| " << c.variant << " | " << c.base << " | " << c.n_variant << " vs " << c.n_base << " | "
        << printf_number("%+.4g", c.mean_difference) << " | " << printf_number("%.3f", c.welch.t) << " | "
        << printf_number("%.2f", c.welch.df) << " | " << p_value(c.welch.p_less) << " | "
        << p_value(c.welch.p_two_sided) << " | " << printf_number("%.3f", c.hedges_g) << " | "
        << p_value(c.p_bonferroni) << " | " << (c.p_bonferroni < kAlpha ? "*" : "") << " |\n";
  }
  out << "\nΔ mean = mean(variant) - mean(base); Hedges' g = Δ mean in pooled sds, small-sample corrected."
      << " One-sided p: the variant has lower " << metric << " than the base."
      << " p Bonferroni: one-sided p times " << report.comparisons.size()
      << " comparisons (at most 1); * when it is below " << kAlpha << ".\n";
  render_paired_markdown(report, out);
  return out.str();
}

// RFC 4180: quote a field holding a comma, quote or newline.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char ch : text) quoted += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return quoted + "\"";
}

std::string csv_number(double value) { return printf_number("%.12g", value); }

// The CSV's columns, in order; a row fills those that apply to it.
constexpr const char* kCsvColumns[] = {
    "table", "variant", "base", "metric", "n", "n_base", "mean", "sd", "mean_diff", "t", "df", "p_one_sided",
    "p_two_sided", "hedges_g", "p_bonferroni", "significant", "sd_diff", "ci_low", "ci_high",
    "ci_half_width_welch", "d_z", "detectable_diff", "seed", "lower", "signed_rank_p_one_sided",
    "signed_rank_p_two_sided"};

class CsvRow {
 public:
  explicit CsvRow(const std::string& table) { set("table", table); }
  CsvRow& set(const std::string& column, const std::string& text) {
    const auto known = std::find(std::begin(kCsvColumns), std::end(kCsvColumns), column);
    if (known == std::end(kCsvColumns)) throw std::logic_error("stats CSV: no column " + column);
    fields_[column] = csv_field(text);
    return *this;
  }
  CsvRow& set(const std::string& column, const char* text) { return set(column, std::string(text)); }  // not bool
  CsvRow& set(const std::string& column, double value) { return set(column, csv_number(value)); }
  CsvRow& set(const std::string& column, std::size_t count) { return set(column, std::to_string(count)); }
  CsvRow& set(const std::string& column, bool flag) { return set(column, std::string(flag ? "true" : "false")); }

  std::string line() const {
    std::string text;
    for (const char* column : kCsvColumns) {
      if (column != kCsvColumns[0]) text += ",";
      if (const auto field = fields_.find(column); field != fields_.end()) text += field->second;
    }
    return text + "\n";
  }

 private:
  std::map<std::string, std::string> fields_;
};

// One long-format table: a "variant" row per variant and metric (that some
// of its runs have; n counts them), a "comparison" row per pair, a
// "paired_comparison" row and a "pair" row per seed for each paired one.
std::string render_csv(const Report& report) {
  std::ostringstream out;
  for (const char* column : kCsvColumns) out << (column == kCsvColumns[0] ? "" : ",") << column;
  out << "\n";
  for (const auto& [name, runs] : report.groups) {
    for (const auto& metric : report.reported_metrics) {
      const auto values = sweep::metric_values(runs, metric);
      if (values.empty()) continue;
      CsvRow row("variant");
      row.set("variant", name).set("metric", metric).set("n", values.size()).set("mean", stats::mean(values));
      if (values.size() >= 2) row.set("sd", stats::sample_sd(values));
      out << row.line();
    }
  }
  for (const auto& c : report.comparisons) {
    out << CsvRow("comparison")
               .set("variant", c.variant).set("base", c.base).set("metric", report.metric)
               .set("n", c.n_variant).set("n_base", c.n_base).set("mean_diff", c.mean_difference)
               .set("t", c.welch.t).set("df", c.welch.df).set("p_one_sided", c.welch.p_less)
               .set("p_two_sided", c.welch.p_two_sided).set("hedges_g", c.hedges_g)
               .set("p_bonferroni", c.p_bonferroni).set("significant", c.p_bonferroni < kAlpha)
               .line();
  }
  for (const auto& c : report.comparisons) {
    if (!c.paired) continue;
    const auto& p = *c.paired;
    const auto& t = p.test;
    out << CsvRow("paired_comparison")
               .set("variant", c.variant).set("base", c.base).set("metric", report.metric)
               .set("n", t.pairs).set("n_base", t.pairs).set("mean_diff", t.mean_difference).set("t", t.t)
               .set("df", t.df).set("p_one_sided", t.p_less).set("p_two_sided", t.p_two_sided)
               .set("p_bonferroni", p.p_bonferroni).set("significant", p.p_bonferroni < kAlpha)
               .set("sd_diff", t.sd_difference).set("ci_low", t.ci_low).set("ci_high", t.ci_high)
               .set("ci_half_width_welch", p.welch_half_width).set("d_z", t.d_z)
               .set("detectable_diff", p.minimum_detectable).set("lower", p.signed_rank.negative)
               .set("signed_rank_p_one_sided", p.signed_rank.p_less)
               .set("signed_rank_p_two_sided", p.signed_rank.p_two_sided)
               .line();
    for (std::size_t i = 0; i < p.seeds.size(); ++i) {
      out << CsvRow("pair")
                 .set("variant", c.variant).set("base", c.base).set("metric", report.metric)
                 .set("mean_diff", p.differences[i]).set("seed", std::to_string(p.seeds[i]))
                 .line();
    }
  }
  return out.str();
}

void run_stats(const StatsOptions& options) {
  const Report report = build_report(options);
  const std::string markdown = render_markdown(report);
  std::cout << markdown;
  if (!options.markdown.empty()) write_file_atomically(options.markdown, markdown);
  if (!options.csv.empty()) write_file_atomically(options.csv, render_csv(report));
}

}  // namespace

void add_stats_command(CLI::App& app) {
  auto options = std::make_shared<StatsOptions>();
  auto* cmd = app.add_subcommand("stats", "Mean, sd, Welch and paired t-tests of final metrics over the seeds of a sweep");
  cmd->add_option("RUN_DIR", options->run_dirs,
                  "Run directories, or folders with run directories one or two levels below")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--compare", options->compare, "VARIANT:BASE pair to test (repeatable; default: automatic pairs)")
      ->allow_extra_args(false)
      ->type_name("VARIANT:BASE");
  cmd->add_option("--metric", options->metric,
                  "Metric the comparisons test (lower is better), EVALUATION_MEASURE: EVALUATION valid or test (the "
                  "run's final evaluations) or NAME (an evaluation saved by `cqk eval --save NAME`); MEASURE ppl "
                  "(perplexity per token), bpb (bits per byte), word_ppl (word-level perplexity), seen_loss (the "
                  "loss over targets seen in training) or error (1 - accuracy): valid_ppl, test_bpb, NAME_bpb, "
                  "test_error, ...")
      ->check(option_check(sweep::check_metric_name))
      ->type_name("METRIC")
      ->capture_default_str();
  cmd->add_option("--csv", options->csv, "Also write the tables as one long-format CSV to FILE")->type_name("FILE");
  cmd->add_option("--markdown", options->markdown, "Also write the Markdown report to FILE")->type_name("FILE");
  cmd->add_flag("--unpaired", options->unpaired,
                "Welch's test only, even for runs initialised keyed by name (which are otherwise also paired by seed)");
  cmd->footer(
      "A run counts once its directory holds results.json; directories with only metrics.jsonl are listed as "
      "unfinished (a diverged one with the step and the first non-finite value, from its diverged.json).\n"
      "Without --compare, each variant whose name carries a coupling marker ('-affine', '+affine' or '-coupled', "
      "at the end of the name or followed by '-') is paired with the variant named without it, when that one has "
      "finished runs: diff-affine-150m vs diff-150m, mta+affine vs mta.\n"
      "Runs that record \"initialisation\": \"name-keyed\" in results.json start, seed for seed, from the same "
      "weights and batches as their base: such comparisons also get a paired t-test over the seeds both have.\n"
      "Each comparison tests variant < base (lower is better for every metric). Bonferroni corrects the one-sided p over "
      "the number of comparisons; '*' marks corrected p < 0.05.");
  // Errors are std::runtime_error with a one-line message; main() prints it and exits with 2.
  cmd->callback([options] { run_stats(*options); });
}

}  // namespace cqk::cli
