#include "cqk/statistics.h"

#include <algorithm>
#include <cmath>
#include <limits>
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
  r.standard_error = std::sqrt(se2);
  r.t = (mean(a) - mean(b)) / r.standard_error;
  r.df = se2 * se2 / (va * va / static_cast<double>(a.size() - 1) + vb * vb / static_cast<double>(b.size() - 1));
  // Lower tails only: the upper tail of t is the lower tail of -t, with no 1 - p cancellation.
  r.p_less = student_t_cdf(r.t, r.df);
  r.p_greater = student_t_cdf(-r.t, r.df);
  r.p_two_sided = 2.0 * student_t_cdf(-std::fabs(r.t), r.df);
  return r;
}

double student_t_quantile(double p, double df) {
  if (!(p > 0 && p < 1)) throw std::invalid_argument("student_t_quantile: p must lie in (0, 1)");
  if (!(df > 0)) throw std::invalid_argument("student_t_quantile: degrees of freedom must be positive");
  // Bisection on the monotone CDF within |t| < 1e7: at df = 1 that covers
  // p down to about 3e-8 (t ~ -1/(pi p)), more at larger df; beyond, +-1e7.
  double lo = -1e7, hi = 1e7;
  for (int i = 0; i < 200 && hi - lo > 1e-13 * std::max(1.0, std::fabs(lo)); ++i) {
    const double mid = 0.5 * (lo + hi);
    (student_t_cdf(mid, df) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

double noncentral_t_cdf(double t, double df, double delta) {
  if (!(df >= 1)) throw std::invalid_argument("noncentral_t_cdf: degrees of freedom must be at least 1");
  // T = (Z + delta) / sqrt(V/df) with V ~ chi^2(df): P(T <= t) = E_W[Phi(t W / sqrt(df) - delta)],
  // W = sqrt(V) ~ chi(df). Simpson's rule over W, whose density is smooth and
  // negligible beyond sqrt(df) + 12.
  const double log_norm = (0.5 * df - 1.0) * std::log(2.0) + std::lgamma(0.5 * df);
  const auto integrand = [&](double w) {
    if (w <= 0) return df == 1 ? std::exp(-log_norm) * 0.5 * std::erfc(delta / std::sqrt(2.0)) : 0.0;
    const double density = std::exp((df - 1.0) * std::log(w) - 0.5 * w * w - log_norm);
    return density * 0.5 * std::erfc(-(t * w / std::sqrt(df) - delta) / std::sqrt(2.0));
  };
  const int intervals = 4000;  // even
  const double upper = std::sqrt(df) + 12.0, h = upper / intervals;
  double sum = integrand(0.0) + integrand(upper);
  for (int i = 1; i < intervals; ++i) sum += (i % 2 ? 4.0 : 2.0) * integrand(i * h);
  return std::clamp(sum * h / 3.0, 0.0, 1.0);
}

PairedResult paired_t_test(const std::vector<double>& a, const std::vector<double>& b, double alpha) {
  if (a.size() != b.size())
    throw std::invalid_argument("paired_t_test: " + std::to_string(a.size()) + " values paired with " +
                                std::to_string(b.size()));
  if (!(alpha > 0 && alpha < 1)) throw std::invalid_argument("paired_t_test: alpha must lie in (0, 1)");
  std::vector<double> d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  PairedResult r;
  r.pairs = d.size();
  r.sd_difference = std::sqrt(sample_variance(d, "paired_t_test: the differences"));
  // Differences equal in decimal (1.970 - 1.967 and 1.962 - 1.959) differ in
  // their last bits; a spread that small is rounding, and t would be ~1e13.
  double scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) scale = std::max({scale, std::fabs(a[i]), std::fabs(b[i])});
  if (r.sd_difference <= 8 * std::numeric_limits<double>::epsilon() * scale)
    throw std::domain_error("paired_t_test: every pair has the same difference");
  r.mean_difference = mean(d);
  r.df = static_cast<double>(r.pairs - 1);
  const double se = r.sd_difference / std::sqrt(static_cast<double>(r.pairs));
  r.t = r.mean_difference / se;
  r.p_less = student_t_cdf(r.t, r.df);
  r.p_greater = student_t_cdf(-r.t, r.df);
  r.p_two_sided = 2.0 * student_t_cdf(-std::fabs(r.t), r.df);
  const double half_width = student_t_quantile(1.0 - 0.5 * alpha, r.df) * se;
  r.ci_low = r.mean_difference - half_width;
  r.ci_high = r.mean_difference + half_width;
  r.d_z = r.mean_difference / r.sd_difference;
  return r;
}

SignedRankResult wilcoxon_signed_rank(const std::vector<double>& differences) {
  std::vector<double> d;
  for (double x : differences)
    if (x != 0) d.push_back(x);
  if (d.empty()) throw std::domain_error("wilcoxon_signed_rank: every difference is zero");
  SignedRankResult r;
  r.nonzero = d.size();
  const std::size_t n = d.size();
  // Ranks of |d| from 1, tied values sharing their average rank; doubled, so
  // that every rank (a whole or a half) is a whole number.
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t i, std::size_t j) { return std::fabs(d[i]) < std::fabs(d[j]); });
  std::vector<std::size_t> doubled_rank(n);
  double tie_term = 0;  // sum of t^3 - t over groups of t tied values
  for (std::size_t first = 0; first < n;) {
    std::size_t last = first;
    while (last + 1 < n && std::fabs(d[order[last + 1]]) == std::fabs(d[order[first]])) ++last;
    const double t = static_cast<double>(last - first + 1);
    tie_term += t * t * t - t;
    for (std::size_t k = first; k <= last; ++k) doubled_rank[order[k]] = first + last + 2;  // 2 x average of first+1..last+1
    first = last + 1;
  }
  std::size_t observed = 0, total = 0;  // doubled W+, doubled sum of every rank
  for (std::size_t i = 0; i < n; ++i) {
    total += doubled_rank[i];
    if (d[i] > 0) observed += doubled_rank[i];
    else ++r.negative;
  }
  r.rank_sum_positive = 0.5 * static_cast<double>(observed);
  r.exact = n <= kSignedRankExactMax;
  if (r.exact) {
    // Under the null each difference is positive or negative with probability
    // 1/2 independently: the distribution of doubled W+, one rank at a time.
    std::vector<double> probability(total + 1, 0.0);
    probability[0] = 1.0;
    std::size_t reach = 0;
    for (const std::size_t rank : doubled_rank) {
      reach += rank;
      for (std::size_t s = reach + 1; s-- > 0;)  // downwards: s - rank still holds the previous ranks' value
        probability[s] = 0.5 * (probability[s] + (s >= rank ? probability[s - rank] : 0.0));
    }
    for (std::size_t s = 0; s <= total; ++s) {
      if (s <= observed) r.p_less += probability[s];
      if (s >= observed) r.p_greater += probability[s];
    }
    r.p_less = std::min(1.0, r.p_less);
    r.p_greater = std::min(1.0, r.p_greater);
  } else {
    const double nn = static_cast<double>(n);
    const double mean_w = nn * (nn + 1) / 4;
    const double sd_w = std::sqrt(nn * (nn + 1) * (2 * nn + 1) / 24 - tie_term / 48);
    const double z = (r.rank_sum_positive - mean_w) / sd_w;
    r.p_less = 0.5 * std::erfc(-z / std::sqrt(2.0));
    r.p_greater = 0.5 * std::erfc(z / std::sqrt(2.0));
  }
  r.p_two_sided = std::min(1.0, 2.0 * std::min(r.p_less, r.p_greater));
  return r;
}

double minimum_detectable_difference(std::size_t n, double sd, double alpha, double power) {
  if (n < 2) throw std::invalid_argument("minimum_detectable_difference: needs at least 2 values");
  if (!(alpha > 0 && alpha < 1) || !(power > 0 && power < 1))
    throw std::invalid_argument("minimum_detectable_difference: alpha and power must lie in (0, 1)");
  const double df = static_cast<double>(n - 1), critical = student_t_quantile(1.0 - 0.5 * alpha, df);
  const auto power_at = [&](double delta) {
    return 1.0 - noncentral_t_cdf(critical, df, delta) + noncentral_t_cdf(-critical, df, delta);
  };
  double lo = 0, hi = 1;
  while (power_at(hi) < power) hi *= 2;  // power rises with the noncentrality
  for (int i = 0; i < 100 && hi - lo > 1e-10 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (power_at(mid) < power ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi) * sd / std::sqrt(static_cast<double>(n));
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
