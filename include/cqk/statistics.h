#pragma once
#include <vector>

// Small-sample statistics for comparing seeds of two training variants:
// Welch's t-test (no equal-variance assumption: coupled and uncoupled runs
// need not vary alike), effect sizes and Bonferroni correction. Pure C++ in
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

struct WelchResult {
  double t = 0;            // (mean(a) - mean(b)) / sqrt(var(a)/na + var(b)/nb)
  double df = 0;           // Welch-Satterthwaite degrees of freedom
  double p_less = 0;       // one-sided p for the alternative mean(a) < mean(b)
  double p_greater = 0;    // one-sided p for the alternative mean(a) > mean(b)
  double p_two_sided = 0;  // for mean(a) != mean(b)
};

// Welch's unequal-variance t-test of a against b; each sample needs at least
// two values. Throws std::domain_error when both samples have zero variance
// (the statistic is undefined).
WelchResult welch_t_test(const std::vector<double>& a, const std::vector<double>& b);

// Cohen's d: (mean(a) - mean(b)) over the pooled standard deviation.
double cohens_d(const std::vector<double>& a, const std::vector<double>& b);

// Hedges' g: Cohen's d times the exact small-sample bias correction
// J(n_a + n_b - 2); with three seeds per variant d overstates the effect by ~25%.
double hedges_g(const std::vector<double>& a, const std::vector<double>& b);

// Bonferroni-corrected p for one of `comparisons` tests: min(1, p * comparisons).
double bonferroni(double p, int comparisons);

}  // namespace cqk::stats
