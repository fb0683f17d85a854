#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "cqk/statistics.h"

// Reference values are literals with their source next to them. "scipy" means
// scipy 1.17.1 in float64 (scipy.stats.ttest_ind(a, b, equal_var=False),
// scipy.stats.t.cdf, scipy.special.betainc), computed once by hand.
namespace {

using cqk::stats::WelchResult;
namespace stats = cqk::stats;

const double kPi = std::acos(-1.0);

struct WelchExample {
  const char* source;
  std::vector<double> a, b;
  double t, df, p_two_sided;                       // scipy, full precision
  double published_t, published_df, published_p;  // as printed by the source
};

// Wikipedia, "Welch's t-test", section Examples (data sets A1 and A2 of its
// three examples; the table prints t, nu and p to 2-3 digits), and R's
// t.test(ts1, ts2) output (Welch is R's default) for a fourth pair.
const std::vector<WelchExample>& welch_examples() {
  static const std::vector<WelchExample> examples = {
      {"Wikipedia example 1",
       {27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4},
       {27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4},
       -2.455356398286006, 24.988529290231416, 0.021378001462866992, -2.46, 25.0, 0.021},
      {"Wikipedia example 2",
       {17.2, 20.9, 22.6, 18.1, 21.7, 21.4, 23.5, 24.2, 14.7, 21.8},
       {21.5, 22.8, 21.0, 23.0, 21.6, 23.6, 22.5, 20.7, 23.4, 21.8,
        20.7, 21.7, 21.5, 22.5, 23.6, 21.5, 22.5, 23.5, 21.5, 21.8},
       -1.5654335235985037, 9.904741248650831, 0.14884169660532817, -1.57, 9.9, 0.149},
      {"Wikipedia example 3",
       {19.8, 20.4, 19.6, 17.8, 18.5, 18.9, 18.3, 18.9, 19.5, 22.0},
       {28.2, 26.6, 20.1, 23.3, 25.2, 22.1, 17.7, 27.6, 20.6, 13.7,
        23.2, 17.5, 20.6, 18.0, 23.9, 21.6, 24.3, 20.4, 24.0, 13.2},
       -2.2192409158236233, 24.496223124201244, 0.03597227102979692, -2.22, 24.5, 0.036},
      {"R t.test", {11, 9, 10, 11, 10, 12, 9, 11, 12, 9}, {11, 13, 10, 13, 12, 9, 11, 12, 12, 11},
       -1.8325416653445783, 17.900310146211783, 0.08355979161922325, -1.8325, 17.9, 0.08356},
  };
  return examples;
}

TEST(StatsWelch, MatchesPublishedWorkedExamples) {
  for (const auto& ex : welch_examples()) {
    SCOPED_TRACE(ex.source);
    const WelchResult r = stats::welch_t_test(ex.a, ex.b);
    // Agreement with what the source prints, at the digits it prints.
    EXPECT_NEAR(r.t, ex.published_t, 0.005);
    EXPECT_NEAR(r.df, ex.published_df, 0.05);
    EXPECT_NEAR(r.p_two_sided, ex.published_p, 0.0005);
    // Agreement with an independent float64 implementation, to near double precision.
    EXPECT_NEAR(r.t, ex.t, 1e-12);
    EXPECT_NEAR(r.df, ex.df, 1e-10);
    EXPECT_NEAR(r.p_two_sided, ex.p_two_sided, 1e-12);
  }
}

TEST(StatsWelch, OneSidedPValuesSplitTheTwoSidedOne) {
  // Wikipedia example 1; scipy alternative='less' and 'greater'.
  const auto& ex = welch_examples()[0];
  const WelchResult r = stats::welch_t_test(ex.a, ex.b);
  EXPECT_NEAR(r.p_less, 0.010689000731433496, 1e-13);
  EXPECT_NEAR(r.p_greater, 0.9893109992685665, 1e-13);
  EXPECT_NEAR(r.p_less + r.p_greater, 1.0, 1e-14);
  // Swapping the samples flips the sign of t and swaps the tails.
  const WelchResult swapped = stats::welch_t_test(ex.b, ex.a);
  EXPECT_DOUBLE_EQ(swapped.t, -r.t);
  EXPECT_DOUBLE_EQ(swapped.df, r.df);
  EXPECT_DOUBLE_EQ(swapped.p_less, r.p_greater);
}

TEST(StatsWelch, RejectsTooFewValuesAndZeroVariance) {
  EXPECT_THROW(stats::welch_t_test({1.0}, {1.0, 2.0}), std::invalid_argument);
  EXPECT_THROW(stats::welch_t_test({1.0, 2.0}, {}), std::invalid_argument);
  EXPECT_THROW(stats::welch_t_test({3.0, 3.0}, {4.0, 4.0, 4.0}), std::domain_error);
  // One constant sample is fine: df falls back to the other's n - 1.
  const WelchResult r = stats::welch_t_test({3.0, 3.0}, {4.0, 5.0, 6.0});
  EXPECT_NEAR(r.df, 2.0, 1e-12);
}

TEST(StatsStudentT, MatchesStandardTableCriticalValues) {
  // Critical values of Student's t from a standard table (printed to 3 decimals,
  // hence the 1e-4 tolerance on p).
  const auto two_sided = [](double t, double df) { return 2.0 * stats::student_t_cdf(-t, df); };
  EXPECT_NEAR(two_sided(2.228, 10), 0.05, 1e-4);
  EXPECT_NEAR(two_sided(3.169, 10), 0.01, 1e-4);
  EXPECT_NEAR(two_sided(2.086, 20), 0.05, 1e-4);
  EXPECT_NEAR(two_sided(12.706, 1), 0.05, 1e-4);
  EXPECT_NEAR(1.0 - stats::student_t_cdf(1.812, 10), 0.05, 1e-4);  // one-sided
  EXPECT_DOUBLE_EQ(stats::student_t_cdf(0.0, 7.0), 0.5);
}

TEST(StatsStudentT, MatchesClosedFormsToDoublePrecision) {
  for (double t : {-50.0, -3.0, -0.7, -1e-6, 0.2, 1.0, 4.5, 30.0}) {
    SCOPED_TRACE(t);
    // df = 1 is the Cauchy distribution; df = 2 has F(t) = 1/2 + t / (2 sqrt(t^2 + 2)).
    EXPECT_NEAR(stats::student_t_cdf(t, 1.0), 0.5 + std::atan(t) / kPi, 1e-14);
    EXPECT_NEAR(stats::student_t_cdf(t, 2.0), 0.5 + t / (2.0 * std::sqrt(t * t + 2.0)), 1e-14);
  }
  // The far lower tail keeps its relative precision: F(-t) = 1 / (s (s + t)), s = sqrt(t^2 + 2).
  const double s = std::sqrt(1e6 + 2.0);
  EXPECT_NEAR(stats::student_t_cdf(-1000.0, 2.0) / (1.0 / (s * (s + 1000.0))), 1.0, 1e-12);
}

TEST(StatsStudentT, MatchesReferenceAtNonIntegerDegreesOfFreedom) {
  // scipy.stats.t.cdf.
  EXPECT_NEAR(stats::student_t_cdf(1.0, 3.5), 0.8093313732182774, 1e-13);
  EXPECT_NEAR(stats::student_t_cdf(-0.5, 7.3), 0.31589676340222084, 1e-13);
  EXPECT_NEAR(stats::student_t_cdf(-30.0, 7.5) / 2.1873667050518222e-09, 1.0, 1e-11);
  EXPECT_THROW(stats::student_t_cdf(1.0, 0.0), std::invalid_argument);
}

TEST(StatsIncompleteBeta, SatisfiesIdentities) {
  // Dyadic x, so that 1 - x is exact and the symmetry is tested, not rounding.
  for (double x : {0.0, 0x1p-30, 0.125, 0.5, 0.75, 0x1.ffcp-1, 1.0}) {
    SCOPED_TRACE(x);
    EXPECT_NEAR(stats::incomplete_beta(x, 1, 1), x, 1e-15);
    EXPECT_NEAR(stats::incomplete_beta(x, 3.5, 1), std::pow(x, 3.5), 1e-14);
    EXPECT_NEAR(stats::incomplete_beta(x, 1, 2.5), 1.0 - std::pow(1.0 - x, 2.5), 1e-14);
    EXPECT_NEAR(stats::incomplete_beta(x, 0.5, 0.5), 2.0 / kPi * std::asin(std::sqrt(x)), 1e-14);
    for (auto [a, b] : {std::pair{2.5, 4.0}, std::pair{0.3, 7.0}, std::pair{40.0, 55.0}}) {
      EXPECT_NEAR(stats::incomplete_beta(x, a, b), 1.0 - stats::incomplete_beta(1.0 - x, b, a), 1e-14);
    }
  }
}

TEST(StatsIncompleteBeta, MatchesReferenceValues) {
  // scipy.special.betainc(a, b, x).
  EXPECT_NEAR(stats::incomplete_beta(0.3, 2.5, 4.0), 0.3521975859067672, 1e-14);
  EXPECT_NEAR(stats::incomplete_beta(0.5, 50, 60), 0.8309072939016693, 1e-13);
  EXPECT_NEAR(stats::incomplete_beta(0.01, 10, 3) / 6.480550000000001e-19, 1.0, 1e-12);
  EXPECT_THROW(stats::incomplete_beta(1.5, 1, 1), std::invalid_argument);
  EXPECT_THROW(stats::incomplete_beta(0.5, 0, 1), std::invalid_argument);
}

TEST(StatsDescriptive, MeanAndSampleSd) {
  const std::vector<double> xs{2, 4, 4, 4, 5, 5, 7, 9};  // population sd 2, so sample sd sqrt(32/7)
  EXPECT_DOUBLE_EQ(stats::mean(xs), 5.0);
  EXPECT_NEAR(stats::sample_sd(xs), std::sqrt(32.0 / 7.0), 1e-15);
  EXPECT_THROW(stats::mean({}), std::invalid_argument);
  EXPECT_THROW(stats::sample_sd({1.0}), std::invalid_argument);
}

TEST(StatsEffectSize, CohensDAndHedgesG) {
  const auto& ex = welch_examples()[0];
  // numpy: (mean(a) - mean(b)) / pooled sd; g with the exact J(28) from math.lgamma.
  EXPECT_NEAR(stats::cohens_d(ex.a, ex.b), -0.8965693907039232, 1e-13);
  EXPECT_NEAR(stats::hedges_g(ex.a, ex.b), -0.8723011535920734, 1e-13);
  // Hedges' approximation J ~ 1 - 3 / (4 (n_a + n_b) - 9) is close at n = 30.
  EXPECT_NEAR(stats::hedges_g(ex.a, ex.b) / stats::cohens_d(ex.a, ex.b), 1.0 - 3.0 / (4.0 * 30 - 9), 1e-4);
  // Three seeds each: J(4) = Gamma(2) / (sqrt(2) Gamma(3/2)) = sqrt(2 / pi).
  const std::vector<double> a{1, 2, 4}, b{2, 5, 6};
  EXPECT_NEAR(stats::hedges_g(a, b) / stats::cohens_d(a, b), std::sqrt(2.0 / kPi), 1e-14);
  EXPECT_THROW(stats::cohens_d({1.0}, b), std::invalid_argument);
  EXPECT_THROW(stats::hedges_g({2.0, 2.0}, {2.0, 2.0}), std::domain_error);
}

void expect_signed_rank(const std::vector<double>& d, double p_less, double p_greater, double p_two_sided,
                        bool exact, double tolerance) {
  const auto r = stats::wilcoxon_signed_rank(d);
  EXPECT_EQ(r.exact, exact);
  EXPECT_NEAR(r.p_less, p_less, tolerance);
  EXPECT_NEAR(r.p_greater, p_greater, tolerance);
  EXPECT_NEAR(r.p_two_sided, p_two_sided, tolerance);
}

TEST(StatsSignedRank, SmallSamplesByHand) {
  // Every difference below zero: W+ = 0, reached by one of the 2^n sign assignments.
  expect_signed_rank({-1, -2, -3}, 1.0 / 8, 1.0, 2.0 / 8, true, 1e-15);
  expect_signed_rank({-0.5, -0.1, -0.3, -0.9, -0.7}, 1.0 / 32, 1.0, 2.0 / 32, true, 1e-15);
  // {+1, -2}: W+ = 1; of the 4 assignments W+ is 0, 1, 2, 3: P(W+ <= 1) = 1/2, P(W+ >= 1) = 3/4.
  expect_signed_rank({1, -2}, 0.5, 0.75, 1.0, true, 1e-15);
  const auto r = stats::wilcoxon_signed_rank({0.0, -1.0, 2.0, 0.0, -3.0});
  EXPECT_EQ(r.nonzero, 3u);
  EXPECT_EQ(r.negative, 2u);
  EXPECT_DOUBLE_EQ(r.rank_sum_positive, 2.0);
  EXPECT_THROW(stats::wilcoxon_signed_rank({0.0, 0.0}), std::domain_error);
}

// scipy 1.17.1: wilcoxon(d, method="exact") without ties; with ties and a
// zero, wilcoxon(d, method=PermutationMethod()), which at n <= 13 enumerates
// every sign assignment; above 50, method="asymptotic", correction=False.
TEST(StatsSignedRank, MatchesScipy) {
  expect_signed_rank({-0.12, 0.03, -0.25, -0.07, 0.11, -0.31, -0.02, -0.18, 0.05, -0.09}, 0.052734375,
                     0.9580078125, 0.10546875, true, 1e-14);
  expect_signed_rank({-0.5, 0.25, -0.25, 0.0, -1.0, -0.5, 0.75, -0.5, -2.0}, 0.078125, 0.9296875, 0.15625, true,
                     1e-14);
  const std::vector<double> sixty = {
      1.9,  -2.7, 0.3,  -0.7, -0.6, -0.3, -2.1, -0.3, -1.0, 3.2,  0.1,  -0.5, -0.4, -0.8, -1.2,
      -0.5, 0.4,  -0.3, 0.9,  -0.3, -0.1, 1.4,  0.4,  -0.6, -0.3, 0.4,  1.8,  -0.4, -0.3, 0.9,
      -1.0, -0.4, 0.8,  0.5,  0.0,  0.6,  -2.9, 0.9,  -1.1, -1.8, 0.2,  0.6,  -0.5, -1.2, -0.1,
      -0.2, 1.3,  0.6,  0.1,  1.0,  -0.3, -1.0, 0.5,  0.5,  -0.3, -0.9, 0.1,  -2.6, 0.6,  0.4};
  expect_signed_rank(sixty, 0.22950844234047957, 0.7704915576595204, 0.45901688468095914, false, 1e-12);
}

// Differences equal in decimal are a few ulps apart as doubles: no spread to
// test against, not a t of 1e13. A small real spread is still tested.
TEST(StatsPaired, SpreadOfRoundingOnlyIsNoSpread) {
  const std::vector<double> base{1.970, 1.962, 1.975, 1.968};
  const std::vector<double> variant{1.967, 1.959, 1.972, 1.965};  // -0.003 each, to rounding
  ASSERT_NE(variant[0] - base[0], variant[2] - base[2]);           // the premise: not bit-equal
  EXPECT_THROW(stats::paired_t_test(variant, base), std::domain_error);
  EXPECT_THROW(stats::paired_t_test({2.0, 3.0}, {1.0, 2.0}), std::domain_error);
  const auto r = stats::paired_t_test({1.967, 1.959, 1.972, 1.9651}, base);
  EXPECT_NEAR(r.mean_difference, -0.002975, 1e-12);
  EXPECT_LT(r.t, -50);
}

TEST(StatsBonferroni, MultipliesAndCapsAtOne) {
  EXPECT_DOUBLE_EQ(stats::bonferroni(0.01, 3), 0.03);
  EXPECT_DOUBLE_EQ(stats::bonferroni(0.02, 1), 0.02);
  EXPECT_DOUBLE_EQ(stats::bonferroni(0.4, 3), 1.0);
  EXPECT_DOUBLE_EQ(stats::bonferroni(0.0, 5), 0.0);
  EXPECT_THROW(stats::bonferroni(0.01, 0), std::invalid_argument);
  EXPECT_THROW(stats::bonferroni(1.5, 2), std::invalid_argument);
}

}  // namespace
