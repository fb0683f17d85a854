"""`cqk stats` on paired runs against scipy: the paired t-test (ttest_rel),
Wilcoxon's signed-rank test (wilcoxon), Welch's test (ttest_ind with equal_var=False), their confidence intervals
(t quantiles) and the minimum detectable difference (noncentral t).

Usage: paired_stats_check.py CQK_TOOL WORK_DIR. Exit 0 when every figure
matches. Tolerances: 1e-9 relative for the closed forms (t, df, p, CI, d_z),
1e-6 relative for the detectable difference, which cqk integrates numerically.
"""
import csv
import json
import math
import os
import shutil
import subprocess
import sys

import scipy
from scipy import optimize, stats

tool, work = sys.argv[1], sys.argv[2]
# Runs left by an earlier pass would add comparisons and change Bonferroni.
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)

# Two comparisons (so Bonferroni doubles p): vanilla with seeds 1-5 on both
# sides; qknorm where the coupled side lacks seed 5 (paired on 1-4).
BASE = {"cpu-vanilla": [1.970, 1.962, 1.975, 1.968, 1.959],
        "cpu-qknorm": [1.940, 1.951, 1.938, 1.947, 1.944]}
COUPLED = {"cpu-vanilla-affine": [1.966, 1.961, 1.969, 1.967, 1.952],
           "cpu-qknorm-affine": [1.941, 1.946, 1.932, 1.946]}


def write_run(name, seed, bpb, keyed=True):
    folder = os.path.join(work, "runs", name, f"seed{seed}")
    os.makedirs(folder, exist_ok=True)
    results = {"name": name, "seed": seed, "valid_ppl": 100.0, "test_ppl": 100.0,
               "test": {"ppl": 100.0, "bpb": bpb}}
    if keyed:
        results["initialisation"] = "name-keyed"
    with open(os.path.join(folder, "results.json"), "w") as f:
        json.dump(results, f)


for runs in (BASE, COUPLED):
    for name, values in runs.items():
        for seed, value in enumerate(values, start=1):
            write_run(name, seed, value)

failures = []


def close(what, got, want, rel):
    if not math.isclose(float(got), want, rel_tol=rel, abs_tol=1e-12):
        failures.append(f"{what}: cqk {got}, scipy {want!r}")


def run_stats(*extra):
    out = os.path.join(work, "stats.csv")
    result = subprocess.run([tool, "stats", os.path.join(work, "runs"), "--metric", "test_bpb", "--csv", out, *extra],
                            capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"cqk stats failed ({result.returncode}): {result.stdout}{result.stderr}")
    with open(out) as f:
        return result.stdout, list(csv.DictReader(f))


markdown, rows = run_stats()
comparisons = 2
for variant, base in (("cpu-vanilla-affine", "cpu-vanilla"), ("cpu-qknorm-affine", "cpu-qknorm")):
    a, b = COUPLED[variant], BASE[base]
    n = min(len(a), len(b))
    label = f"{variant} vs {base}"
    by_table = {r["table"]: r for r in rows if r["variant"] == variant and r["table"] != "pair"}

    welch = stats.ttest_ind(a, b, equal_var=False, alternative="less")
    row = by_table["comparison"]
    close(label + " Welch t", row["t"], welch.statistic, 1e-9)
    close(label + " Welch df", row["df"], welch.df, 1e-9)
    close(label + " Welch p one-sided", row["p_one_sided"], welch.pvalue, 1e-9)

    paired = stats.ttest_rel(a[:n], b[:n], alternative="less")
    two_sided = stats.ttest_rel(a[:n], b[:n])
    ci = two_sided.confidence_interval(0.95)
    differences = [x - y for x, y in zip(a[:n], b[:n])]
    sd = stats.tstd(differences)
    row = by_table["paired_comparison"]
    close(label + " pairs", row["n"], n, 0)
    close(label + " paired mean", row["mean_diff"], sum(differences) / n, 1e-9)
    close(label + " paired sd", row["sd_diff"], sd, 1e-9)
    close(label + " paired t", row["t"], paired.statistic, 1e-9)
    close(label + " paired df", row["df"], paired.df, 0)
    close(label + " paired p one-sided", row["p_one_sided"], paired.pvalue, 1e-9)
    close(label + " paired p two-sided", row["p_two_sided"], two_sided.pvalue, 1e-9)
    close(label + " paired CI low", row["ci_low"], ci.low, 1e-9)
    close(label + " paired CI high", row["ci_high"], ci.high, 1e-9)
    close(label + " d_z", row["d_z"], (sum(differences) / n) / sd, 1e-9)
    close(label + " paired p Bonferroni", row["p_bonferroni"], min(1.0, comparisons * paired.pvalue), 1e-9)

    # Wilcoxon's signed-rank test; at n <= 13 scipy's default is exact (a permutation test when values tie).
    close(label + " lower", row["lower"], sum(x < 0 for x in differences), 0)
    close(label + " signed-rank p one-sided", row["signed_rank_p_one_sided"],
          stats.wilcoxon(differences, alternative="less").pvalue, 1e-12)
    close(label + " signed-rank p two-sided", row["signed_rank_p_two_sided"], stats.wilcoxon(differences).pvalue, 1e-12)

    welch_same_runs = stats.ttest_ind(a[:n], b[:n], equal_var=False).confidence_interval(0.95)
    close(label + " Welch CI half-width", row["ci_half_width_welch"], (welch_same_runs.high - welch_same_runs.low) / 2,
          1e-9)

    # The smallest |mean difference| a two-sided paired t-test at 0.05 finds with power 0.8.
    df, critical = n - 1, stats.t.ppf(0.975, n - 1)

    def power(delta):
        return stats.nct.sf(critical, df, delta) + stats.nct.cdf(-critical, df, delta)

    delta = optimize.brentq(lambda d: power(d) - 0.8, 0.0, 8.0, xtol=1e-14, rtol=1e-14)
    close(label + " detectable difference", row["detectable_diff"], delta * sd / math.sqrt(n), 1e-6)

    seeds = sorted(int(r["seed"]) for r in rows if r["table"] == "pair" and r["variant"] == variant)
    if seeds != list(range(1, n + 1)):
        failures.append(f"{label}: pair rows for seeds {seeds}")

if "Paired comparisons on test_bpb" not in markdown or "left out, one side only: seeds 5" not in markdown:
    failures.append("the Markdown report lacks the paired table or the left-out seed:\n" + markdown)

_, unpaired_rows = run_stats("--unpaired")
if any(r["table"] in ("paired_comparison", "pair") for r in unpaired_rows):
    failures.append("--unpaired still reports paired rows")

# Runs without the name-keyed initialisation are not paired.
write_run("cpu-vanilla", 1, BASE["cpu-vanilla"][0], keyed=False)
_, old_rows = run_stats()
if any(r["table"] == "paired_comparison" and r["base"] == "cpu-vanilla" for r in old_rows):
    failures.append("a base run without name-keyed initialisation was paired")

# Keyed runs with one seed in common: Welch's test only, and a note that says why there is no paired one.
for seed, value in ((1, 1.90), (2, 1.91)):
    write_run("cpu-diff", seed, value)
for seed, value in ((2, 1.89), (3, 1.92)):
    write_run("cpu-diff-affine", seed, value)
one_seed, _ = run_stats()
if "cpu-diff-affine vs cpu-diff: no paired test (fewer than 2 seeds in common)" not in one_seed:
    failures.append("no note for a keyed pair with one seed in common:\n" + one_seed)

# Every pair differs by the same amount: no t-test, the signed-rank test in the note.
for seed, value in enumerate((2.0, 2.5, 3.0, 3.5), start=1):
    write_run("cpu-mta", seed, value)
    write_run("cpu-mta-affine", seed, value - 0.25)  # dyadic: each difference exactly -0.25
# ... also when they are equal in decimal only (a few ulps apart as doubles).
for seed, value in enumerate((1.970, 1.962, 1.975, 1.968), start=1):
    write_run("cpu-rope", seed, value)
    write_run("cpu-rope-affine", seed, round(value - 0.003, 3))
same, _ = run_stats()
want = stats.wilcoxon([-0.25] * 4, alternative="less").pvalue
note = f"cpu-rope-affine vs cpu-rope: no paired test (every pair differs by -0.003; signed-rank: 4 of 4 lower, p one-sided {want:.4f})"
if note not in same:
    failures.append(f"no signed-rank note for differences equal in decimal (want '{note}'):\n" + same)
note = f"cpu-mta-affine vs cpu-mta: no paired test (every pair differs by -0.25; signed-rank: 4 of 4 lower, p one-sided {want:.4f})"
if note not in same:
    failures.append(f"no signed-rank note for equal differences (want '{note}'):\n" + same)

if failures:
    print("\n".join(failures))
    sys.exit(1)
print(f"cqk stats matches scipy {scipy.__version__} on 2 paired and 2 Welch comparisons")
