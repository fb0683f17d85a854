#include "cqk/statistics.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace cqk::stats {
namespace {

constexpr double kEpsilon = 1e-15;  // Lentz stops when a step changes the fraction by less
constexpr double kTiny = 1e-300;    // keeps Lentz's denominators away from zero
constexpr int kMaxIterations = 10000;

void require_values(const std::vector<double>& xs, std::size_t needed, const char* what) {
  if (xs.size() < needed) {
    throw std::invalid_argument(std::string(what) + " needs at least " + std::to_string(needed) +
                                " values, got " + std::to_string(xs.size()));
  }
}

double sample_variance(const std::vector<double>& xs, const char* what) {
  require_values(xs, 2, what);
  const double m = mean(xs);
  double sum = 0;
  for (double x : xs) sum += (x - m) * (x - m);  // two passes: no cancellation
  return sum / static_cast<double>(xs.size() - 1);
}

double pooled_sd(const std::vector<double>& a, const std::vector<double>& b) {
  const double na = static_cast<double>(a.size()), nb = static_cast<double>(b.size());
  const double pooled_var =
      ((na - 1) * sample_variance(a, "pooled sd: sample a") + (nb - 1) * sample_variance(b, "pooled sd: sample b")) /
      (na + nb - 2);
  if (pooled_var == 0) throw std::domain_error("effect size: both samples have zero variance");
  return std::sqrt(pooled_var);
}

// Continued fraction of I_x(a, b) (Numerical Recipes, eq. 6.4.5), evaluated
// with the modified Lentz method; converges fast for x < (a + 1) / (a + b + 2).
double beta_continued_fraction(double x, double a, double b) {
  const auto guard = [](double v) { return std::fabs(v) < kTiny ? kTiny : v; };
  double c = 1.0;
  double d = 1.0 / guard(1.0 - (a + b) * x / (a + 1.0));
  double h = d;
  for (int m = 1; m <= kMaxIterations; ++m) {
    const double m2 = 2.0 * m;
    // Even step d_{2m}, then odd step d_{2m+1} of the fraction.
    const double even = m * (b - m) * x / ((a - 1.0 + m2) * (a + m2));
    d = 1.0 / guard(1.0 + even * d);
    c = guard(1.0 + even / c);
    h *= d * c;
    const double odd = -(a + m) * (a + b + m) * x / ((a + m2) * (a + 1.0 + m2));
    d = 1.0 / guard(1.0 + odd * d);
    c = guard(1.0 + odd / c);
    const double step = d * c;
    h *= step;
    if (std::fabs(step - 1.0) < kEpsilon) return h;
  }
  throw std::runtime_error("incomplete_beta: continued fraction did not converge");
}

// I_x(a, b) with y = 1 - x passed in separately, so callers that know the
// complement exactly (the t distribution near t = 0) lose no digits to 1 - x.
double incomplete_beta_split(double x, double y, double a, double b) {
  if (x <= 0) return 0;
  if (y <= 0) return 1;
  const double log_front = a * std::log(x) + b * std::log(y) - (std::lgamma(a) + std::lgamma(b) - std::lgamma(a + b));
  const double front = std::exp(log_front);
  // Use the fraction only where it converges fast; elsewhere the symmetry I_x(a,b) = 1 - I_y(b,a).
  if (x < (a + 1.0) / (a + b + 2.0)) return front * beta_continued_fraction(x, a, b) / a;
  return 1.0 - front * beta_continued_fraction(y, b, a) / b;
}

}  // namespace

double mean(const std::vector<double>& xs) {
  require_values(xs, 1, "mean");
  double sum = 0;
  for (double x : xs) sum += x;
  return sum / static_cast<double>(xs.size());
}

double sample_sd(const std::vector<double>& xs) { return std::sqrt(sample_variance(xs, "sample_sd")); }

double incomplete_beta(double x, double a, double b) {
  if (!(a > 0) || !(b > 0)) throw std::invalid_argument("incomplete_beta: a and b must be positive");
  if (!(x >= 0 && x <= 1)) throw std::invalid_argument("incomplete_beta: x must lie in [0, 1]");
  return incomplete_beta_split(x, 1.0 - x, a, b);
}

double student_t_cdf(double t, double df) {
  if (!(df > 0)) throw std::invalid_argument("student_t_cdf: degrees of freedom must be positive");
  if (std::isnan(t)) throw std::invalid_argument("student_t_cdf: t is NaN");
  if (std::isinf(t)) return t > 0 ? 1.0 : 0.0;
  // P(|T| > |t|) = I_{df/(df+t^2)}(df/2, 1/2); each tail is half of it.
  const double t2 = t * t;
  const double tail = 0.5 * incomplete_beta_split(df / (df + t2), t2 / (df + t2), 0.5 * df, 0.5);
  return t > 0 ? 1.0 - tail : tail;
}

WelchResult welch_t_test(const std::vector<double>& a, const std::vector<double>& b) {
  const double va = sample_variance(a, "welch_t_test: sample a") / static_cast<double>(a.size());
  const double vb = sample_variance(b, "welch_t_test: sample b") / static_cast<double>(b.size());
  const double se2 = va + vb;
  if (se2 == 0) throw std::domain_error("welch_t_test: both samples have zero variance");
  WelchResult r;
  r.t = (mean(a) - mean(b)) / std::sqrt(se2);
  r.df = se2 * se2 / (va * va / static_cast<double>(a.size() - 1) + vb * vb / static_cast<double>(b.size() - 1));
  // Lower tails only: the upper tail of t is the lower tail of -t, with no 1 - p cancellation.
  r.p_less = student_t_cdf(r.t, r.df);
  r.p_greater = student_t_cdf(-r.t, r.df);
  r.p_two_sided = 2.0 * student_t_cdf(-std::fabs(r.t), r.df);
  return r;
}

double cohens_d(const std::vector<double>& a, const std::vector<double>& b) {
  return (mean(a) - mean(b)) / pooled_sd(a, b);
}

double hedges_g(const std::vector<double>& a, const std::vector<double>& b) {
  // Exact correction J(m) = Gamma(m/2) / (sqrt(m/2) Gamma((m-1)/2)) (Hedges 1981), m = n_a + n_b - 2.
  const double m = static_cast<double>(a.size() + b.size()) - 2.0;
  const double d = cohens_d(a, b);
  return d * std::exp(std::lgamma(0.5 * m) - std::lgamma(0.5 * (m - 1.0))) / std::sqrt(0.5 * m);
}

double bonferroni(double p, int comparisons) {
  if (comparisons < 1) throw std::invalid_argument("bonferroni: the number of comparisons must be at least 1");
  if (!(p >= 0 && p <= 1)) throw std::invalid_argument("bonferroni: p must lie in [0, 1]");
  return std::min(1.0, p * comparisons);
}

}  // namespace cqk::stats
