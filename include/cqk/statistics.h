#pragma once
#include <vector>

// Small-sample statistics for comparing seeds of two training variants:
// Welch's t-test (no equal-variance assumption: coupled and uncoupled runs
// need not vary alike), the paired t-test (runs of one seed that share their
// initial weights and batches), Wilcoxon's signed-rank test, effect sizes,
// power and Bonferroni correction. Pure C++ in
// double precision; functions given too few values throw std::invalid_argument.
namespace cqk::stats {

// Arithmetic mean; needs at least one value.
double mean(const std::vector<double>& xs);

// Sample standard deviation (divisor n - 1); needs at least two values.
double sample_sd(const std::vector<double>& xs);

// Regularized incomplete beta function I_x(a, b) for 0 <= x <= 1, a, b > 0,
// to about 1e-12 relative accuracy (continued fraction, modified Lentz).
double incomplete_beta(double x, double a, double b);

// P(T <= t) for Student's t with `df` > 0 degrees of freedom (df need not be
// an integer: Welch's df rarely is). Accurate in both tails.
double student_t_cdf(double t, double df);

// The p-quantile of Student's t with `df` > 0 degrees of freedom, 0 < p < 1
// (student_t_cdf inverted to about 1e-12).
double student_t_quantile(double p, double df);

// P(T <= t) for the noncentral t with `df` >= 1 degrees of freedom and noncentrality
// `delta`, to about 1e-9 (the normal CDF integrated over the chi distribution).
double noncentral_t_cdf(double t, double df, double delta);

struct WelchResult {
  double t = 0;            // (mean(a) - mean(b)) / sqrt(var(a)/na + var(b)/nb)
  double df = 0;           // Welch-Satterthwaite degrees of freedom
  double p_less = 0;       // one-sided p for the alternative mean(a) < mean(b)
  double p_greater = 0;    // one-sided p for the alternative mean(a) > mean(b)
  double p_two_sided = 0;  // for mean(a) != mean(b)
  double standard_error = 0;  // of mean(a) - mean(b): sqrt(var(a)/na + var(b)/nb)
};

// Welch's unequal-variance t-test of a against b; each sample needs at least
// two values. Throws std::domain_error when both samples have zero variance
// (the statistic is undefined).
WelchResult welch_t_test(const std::vector<double>& a, const std::vector<double>& b);

struct PairedResult {
  std::size_t pairs = 0;
  double mean_difference = 0;  // mean of a[i] - b[i]
  double sd_difference = 0;    // sample sd of a[i] - b[i]
  double t = 0;                // mean_difference / (sd_difference / sqrt(pairs))
  double df = 0;               // pairs - 1
  double p_less = 0;           // one-sided, alternative mean(a - b) < 0
  double p_greater = 0;        // one-sided, alternative mean(a - b) > 0
  double p_two_sided = 0;
  double ci_low = 0, ci_high = 0;  // two-sided confidence interval of the mean difference
  double d_z = 0;              // Cohen's d_z: mean_difference / sd_difference
};

// The paired t-test of a against b, a[i] and b[i] being one pair (same size, at
// least two pairs), with a two-sided (1 - alpha) confidence interval. Throws
// std::domain_error when every difference is the same, to rounding (a spread
// within a few ulps of the values).
PairedResult paired_t_test(const std::vector<double>& a, const std::vector<double>& b, double alpha = 0.05);

struct SignedRankResult {
  std::size_t nonzero = 0;    // differences other than zero (Wilcoxon drops the zeros)
  std::size_t negative = 0;   // differences below zero
  double rank_sum_positive = 0;  // W+: the ranks of |d| (tied ones averaged) of the positive d, summed
  bool exact = false;         // the exact null distribution given the ties, else the normal approximation
  double p_less = 0;          // one-sided, alternative: the differences lie below zero
  double p_greater = 0;       // one-sided, alternative: they lie above zero
  double p_two_sided = 0;     // min(1, twice the smaller one-sided p)
};

// Wilcoxon's signed-rank test of paired differences against zero: the paired
// test that assumes no normal distribution (where some seeds learn a task and
// others do not, a few differences dwarf the rest). Exact up to kSignedRankExactMax non-zero
// differences (every sign assignment of their ranks, ties included), the normal
// approximation with the tie correction above. Throws std::domain_error when
// every difference is zero.
constexpr std::size_t kSignedRankExactMax = 50;
SignedRankResult wilcoxon_signed_rank(const std::vector<double>& differences);

// The smallest true mean difference that a two-sided one-sample (or paired)
// t-test at level `alpha` over `n` values with standard deviation `sd` detects
// with probability `power` (exact, through the noncentral t).
double minimum_detectable_difference(std::size_t n, double sd, double alpha, double power);

// Cohen's d: (mean(a) - mean(b)) over the pooled standard deviation.
double cohens_d(const std::vector<double>& a, const std::vector<double>& b);

// Hedges' g: Cohen's d times the exact small-sample bias correction
// J(n_a + n_b - 2); with three seeds per variant d overstates the effect by ~25%.
double hedges_g(const std::vector<double>& a, const std::vector<double>& b);

// Bonferroni-corrected p for one of `comparisons` tests: min(1, p * comparisons).
double bonferroni(double p, int comparisons);

}  // namespace cqk::stats
