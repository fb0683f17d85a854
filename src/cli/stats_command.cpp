#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"
#include "cqk/log.h"
#include "cqk/statistics.h"
#include "cqk/sweep_results.h"

namespace cqk::cli {
namespace {

namespace fs = std::filesystem;
using Groups = std::map<std::string, std::vector<sweep::RunResult>>;
using Pair = std::pair<std::string, std::string>;  // (variant, base)

constexpr double kAlpha = 0.05;

struct StatsOptions {
  std::vector<std::string> run_dirs;
  std::vector<std::string> compare;
  std::string metric = "valid_ppl";
  std::string csv;
  std::string markdown;
};

struct Comparison {
  std::string variant, base;
  std::size_t n_variant = 0, n_base = 0;
  double mean_difference = 0;  // variant - base: negative means the variant reaches a lower (better) value
  stats::WelchResult welch;
  double hedges_g = 0;
  double p_bonferroni = 0;  // of the one-sided p (variant better), over all comparisons
};

struct Report {
  sweep::Metric metric = sweep::Metric::valid_ppl;
  Groups groups;
  std::vector<fs::path> unfinished;
  std::vector<Comparison> comparisons;
  std::vector<std::string> notes;
};

std::string format(const char* spec, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, spec, value);
  return buffer;
}

std::string p_value(double p) { return format(p >= 1e-3 ? "%.4f" : "%.1e", p); }

// "mean ± sd", with the count when only some of the runs have the metric; "-" when none has.
std::string mean_sd(const std::vector<sweep::RunResult>& runs, sweep::Metric metric) {
  const auto values = sweep::metric_values(runs, metric);
  if (values.empty()) return "-";
  std::string m = format("%.3f", stats::mean(values));
  if (values.size() >= 2) m += " ± " + format("%.3f", stats::sample_sd(values));
  return values.size() < runs.size() ? m + " (n=" + std::to_string(values.size()) + ")" : m;
}

// The metrics that at least one finished run has, in kMetrics order.
std::vector<sweep::Metric> reported_metrics(const Groups& groups) {
  std::vector<sweep::Metric> metrics;
  for (const auto metric : sweep::kMetrics) {
    for (const auto& [name, runs] : groups) {
      if (!sweep::metric_values(runs, metric).empty()) {
        metrics.push_back(metric);
        break;
      }
    }
  }
  return metrics;
}

// The metric of every run of a variant; an error names a run without it.
std::vector<double> compared_values(const std::vector<sweep::RunResult>& runs, sweep::Metric metric) {
  for (const auto& run : runs) {
    if (!sweep::metric_value(run, metric))
      throw std::runtime_error((run.dir / "results.json").string() + " has no " + sweep::metric_name(metric) +
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

Comparison compare(const Groups& groups, const Pair& pair, sweep::Metric metric) {
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
  } catch (const std::exception& e) {
    throw std::runtime_error(pair.first + " vs " + pair.second + ": " + e.what());
  }
  return c;
}

void warn_about_repeated_seeds(const Groups& groups) {
  for (const auto& [name, runs] : groups) {
    for (std::size_t i = 1; i < runs.size(); ++i) {
      if (runs[i].seed == runs[i - 1].seed) {  // runs are sorted by seed within a name
        log::warn("stats: " + name + " has seed " + std::to_string(runs[i].seed) + " more than once (" +
                  runs[i - 1].dir.string() + ", " + runs[i].dir.string() + "); both are counted");
      }
    }
  }
}

Report build_report(const StatsOptions& options) {
  Report report;
  report.metric = sweep::parse_metric(options.metric);
  const auto runs = sweep::find_runs(std::vector<fs::path>(options.run_dirs.begin(), options.run_dirs.end()));
  report.unfinished = runs.unfinished;
  if (runs.finished.empty()) {
    std::string roots;
    for (const auto& dir : options.run_dirs) roots += " " + dir;
    throw std::runtime_error("no results.json found under" + roots +
                             " (unfinished runs: " + std::to_string(runs.unfinished.size()) + ")");
  }
  report.groups = sweep::group_by_variant(runs.finished);
  warn_about_repeated_seeds(report.groups);
  for (const auto& pair : choose_pairs(options, report)) {
    report.comparisons.push_back(compare(report.groups, pair, report.metric));
  }
  const int m = static_cast<int>(report.comparisons.size());
  for (auto& c : report.comparisons) c.p_bonferroni = stats::bonferroni(c.welch.p_less, m);
  return report;
}

std::string render_markdown(const Report& report) {
  std::ostringstream out;
  std::size_t finished = 0;
  for (const auto& [name, runs] : report.groups) finished += runs.size();
  const auto metrics = reported_metrics(report.groups);
  out << "## Variants (" << finished << " finished runs)\n\n| variant | n |";
  for (const auto metric : metrics) out << " " << sweep::metric_name(metric) << " mean ± sd |";
  out << "\n|---|--:|";
  for (std::size_t i = 0; i < metrics.size(); ++i) out << "--:|";
  out << "\n";
  for (const auto& [name, runs] : report.groups) {
    out << "| " << name << " | " << runs.size() << " |";
    for (const auto metric : metrics) out << " " << mean_sd(runs, metric) << " |";
    out << "\n";
  }
  if (!report.unfinished.empty()) {
    out << "\nUnfinished runs (no results.json, not counted):\n";
    for (const auto& dir : report.unfinished) out << "- " << dir.string() << "\n";
  }
  for (const auto& note : report.notes) out << "\nNote: " << note << "\n";
  if (report.comparisons.empty()) return out.str();

  const char* metric = sweep::metric_name(report.metric);
  out << "\n## Comparisons on " << metric << " (Welch's t-test)\n\n"
      << "| variant | base | n | Δ mean | t | df | p one-sided | p two-sided | Hedges' g | p Bonferroni | sig |\n"
      << "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|:-:|\n";
  for (const auto& c : report.comparisons) {
    out << "| " << c.variant << " | " << c.base << " | " << c.n_variant << " vs " << c.n_base << " | "
        << format("%+.3f", c.mean_difference) << " | " << format("%.3f", c.welch.t) << " | "
        << format("%.2f", c.welch.df) << " | " << p_value(c.welch.p_less) << " | " << p_value(c.welch.p_two_sided)
        << " | " << format("%.3f", c.hedges_g) << " | " << p_value(c.p_bonferroni) << " | "
        << (c.p_bonferroni < kAlpha ? "*" : "") << " |\n";
  }
  out << "\nΔ mean = mean(variant) - mean(base); Hedges' g = Δ mean in pooled sds, small-sample corrected."
      << " One-sided p: the variant has lower " << metric << " than the base."
      << " p Bonferroni: one-sided p times " << report.comparisons.size()
      << " comparisons (at most 1); * when it is below " << kAlpha << ".\n";
  return out.str();
}

// RFC 4180: quote a field holding a comma, quote or newline.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char ch : text) quoted += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return quoted + "\"";
}

std::string csv_number(double value) { return format("%.12g", value); }

// One long-format table: a "variant" row per variant and metric (that some
// of its runs have; n counts them), a "comparison" row per pair; columns that
// do not apply to a row stay empty.
std::string render_csv(const Report& report) {
  std::ostringstream out;
  out << "table,variant,base,metric,n,n_base,mean,sd,mean_diff,t,df,p_one_sided,p_two_sided,hedges_g,"
         "p_bonferroni,significant\n";
  for (const auto& [name, runs] : report.groups) {
    for (const auto metric : sweep::kMetrics) {
      const auto values = sweep::metric_values(runs, metric);
      if (values.empty()) continue;
      out << "variant," << csv_field(name) << ",," << sweep::metric_name(metric) << "," << values.size() << ",,"
          << csv_number(stats::mean(values)) << "," << (values.size() < 2 ? "" : csv_number(stats::sample_sd(values)))
          << ",,,,,,,,\n";
    }
  }
  for (const auto& c : report.comparisons) {
    out << "comparison," << csv_field(c.variant) << "," << csv_field(c.base) << ","
        << sweep::metric_name(report.metric) << "," << c.n_variant << "," << c.n_base << ",,,"
        << csv_number(c.mean_difference) << "," << csv_number(c.welch.t) << "," << csv_number(c.welch.df) << ","
        << csv_number(c.welch.p_less) << "," << csv_number(c.welch.p_two_sided) << "," << csv_number(c.hedges_g)
        << "," << csv_number(c.p_bonferroni) << "," << (c.p_bonferroni < kAlpha ? "true" : "false") << "\n";
  }
  return out.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream file(path);
  file << text;
  if (!file.flush()) throw std::runtime_error("cannot write " + path);
}

void run_stats(const StatsOptions& options) {
  const Report report = build_report(options);
  const std::string markdown = render_markdown(report);
  std::cout << markdown;
  if (!options.markdown.empty()) write_file(options.markdown, markdown);
  if (!options.csv.empty()) write_file(options.csv, render_csv(report));
}

}  // namespace

void add_stats_command(CLI::App& app) {
  auto options = std::make_shared<StatsOptions>();
  auto* cmd = app.add_subcommand("stats", "Mean, sd and Welch t-tests of final metrics over the seeds of a sweep");
  cmd->add_option("RUN_DIR", options->run_dirs,
                  "Run directories, or folders with run directories one or two levels below")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--compare", options->compare, "VARIANT:BASE pair to test (repeatable; default: automatic pairs)")
      ->allow_extra_args(false)
      ->type_name("VARIANT:BASE");
  std::vector<std::string> metric_names;
  for (const auto metric : sweep::kMetrics) metric_names.emplace_back(sweep::metric_name(metric));
  cmd->add_option("--metric", options->metric,
                  "Metric the comparisons test (lower is better): perplexity per token, bits per byte, word-level "
                  "perplexity or the loss over targets seen in training, of the valid or test split")
      ->check(CLI::IsMember(metric_names))
      ->type_name("METRIC")
      ->capture_default_str();
  cmd->add_option("--csv", options->csv, "Also write the tables as one long-format CSV to FILE")->type_name("FILE");
  cmd->add_option("--markdown", options->markdown, "Also write the Markdown report to FILE")->type_name("FILE");
  cmd->footer(
      "A run counts once its directory holds results.json; directories with only metrics.jsonl are listed as "
      "unfinished.\n"
      "Without --compare, each variant whose name carries a coupling marker ('-affine', '+affine' or '-coupled', "
      "at the end of the name or followed by '-') is paired with the variant named without it, when that one has "
      "finished runs: diff-affine-150m vs diff-150m, mta+affine vs mta.\n"
      "Each comparison tests variant < base (lower is better for every metric). Bonferroni corrects the one-sided p over "
      "the number of comparisons; '*' marks corrected p < 0.05.");
  // Errors are std::runtime_error with a one-line message; main() prints it and exits with 2.
  cmd->callback([options] { run_stats(*options); });
}

}  // namespace cqk::cli
