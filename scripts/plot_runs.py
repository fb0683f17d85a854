#!/usr/bin/env python3
"""Plots a sweep's runs as PNGs: training loss vs tokens per variant with a band
over seeds, and final validation/test perplexity per variant with error bars
(and bits per byte, when the runs trained on text and report it).

Run directories are found as `cqk stats` finds them: each RUN_DIR is a run
(holding results.json or metrics.jsonl) or a folder with runs one or two levels
below. Runs are grouped by the "name" in results.json; runs without it
(unfinished) are skipped with a note, and so is a run without a plotted metric
in that metric's plot (results.json from before the metric existed).

    $CQK_VENV/bin/python scripts/plot_runs.py runs/sweep --out plots/
"""
import argparse
import json
import sys
from pathlib import Path

try:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    import numpy as np
except ImportError as e:
    sys.exit(f"plot_runs.py: {e.name} is missing: run it with the Python of the environment scripts/setup.sh "
             "makes (~/.cache/cqk/torch-VERSION-pyX.Y/bin/python), which has numpy and matplotlib")


def is_run_dir(path):
    return (path / "results.json").is_file() or (path / "metrics.jsonl").is_file()


def find_run_dirs(roots, levels=2):
    """Run directories at each root or up to `levels` below it, each once."""
    found = {}

    def visit(path, levels_left):
        if is_run_dir(path):
            found.setdefault(path.resolve(), path)
        elif levels_left > 0:
            for child in sorted(p for p in path.iterdir() if p.is_dir()):
                visit(child, levels_left - 1)

    for root in roots:
        if not root.is_dir():
            sys.exit(f"plot_runs: {root}: not a directory")
        visit(root, levels)
    return list(found.values())


def read_metrics(path):
    """Rows of metrics.jsonl that carry tokens and loss. A torn last line (a run
    killed mid-write) is skipped rather than fatal."""
    rows = []
    if not path.is_file():
        return rows
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            print(f"plot_runs: {path}:{number}: skipped ({error})", file=sys.stderr)
            continue
        # Evaluation lines (valid_loss, ...) carry no "loss": training rows only.
        if isinstance(row, dict) and "tokens" in row and "loss" in row:
            rows.append(row)
    return rows


def load_variants(roots):
    """{variant name: [run]}, each run a dict with its results and metrics."""
    variants = {}
    for run_dir in find_run_dirs(roots):
        results_path = run_dir / "results.json"
        if not results_path.is_file():
            print(f"plot_runs: {run_dir}: unfinished (no results.json), skipped", file=sys.stderr)
            continue
        try:
            results = json.loads(results_path.read_text())
            name = results["name"]
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            sys.exit(f"plot_runs: {results_path}: {error!r}")
        run = {"dir": run_dir, "results": results, "metrics": read_metrics(run_dir / "metrics.jsonl")}
        variants.setdefault(name, []).append(run)
    if not variants:
        sys.exit("plot_runs: no finished runs (results.json) found under " + " ".join(map(str, roots)))
    return dict(sorted(variants.items()))


def smoothed(values, window):
    if window <= 1 or len(values) < window:
        return values
    kernel = np.ones(window) / window
    # 'valid' would drop the ends; pad with edge values so the curve keeps its length.
    padded = np.pad(values, (window // 2, window - 1 - window // 2), mode="edge")
    return np.convolve(padded, kernel, mode="valid")


def seed_curves(runs, smooth):
    """Each seed's loss on a shared token grid (seeds may log at different
    steps), over the token range all seeds cover."""
    curves = []
    for run in runs:
        rows = sorted(run["metrics"], key=lambda r: r["tokens"])
        if rows:
            tokens = np.array([r["tokens"] for r in rows], dtype=float)
            curves.append((tokens, smoothed(np.array([r["loss"] for r in rows], dtype=float), smooth)))
    if not curves:
        return None, None
    low = max(t[0] for t, _ in curves)
    high = min(t[-1] for t, _ in curves)
    grid = np.unique(np.concatenate([t[(t >= low) & (t <= high)] for t, _ in curves]))
    return grid, np.stack([np.interp(grid, t, loss) for t, loss in curves])


def plot_loss(variants, out, band, smooth):
    fig, ax = plt.subplots(figsize=(8, 5))
    plotted = []
    for name, runs in variants.items():
        grid, losses = seed_curves(runs, smooth)
        if grid is None or len(grid) == 0:
            print(f"plot_runs: {name}: no loss rows in metrics.jsonl, left out of the loss plot", file=sys.stderr)
            continue
        mean = losses.mean(axis=0)
        if band == "sd" and len(losses) > 1:
            sd = losses.std(axis=0, ddof=1)
            lower, upper = mean - sd, mean + sd
        else:
            lower, upper = losses.min(axis=0), losses.max(axis=0)
        (line,) = ax.plot(grid, mean, lw=1.5, label=f"{name} (n={len(losses)})")
        ax.fill_between(grid, lower, upper, color=line.get_color(), alpha=0.25, lw=0)
        plotted.append(mean)
    if plotted:
        # The first steps' loss (~ln vocab) would squash the interesting part of the curves.
        ax.set_ylim(min(m.min() for m in plotted) * 0.98, np.quantile(np.concatenate(plotted), 0.95))
    ax.set_xlabel("tokens")
    ax.set_ylabel("training loss")
    ax.set_title("Loss vs tokens (mean over seeds; band: " + ("±1 sd" if band == "sd" else "min-max") + ")")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


# Final metrics with a bar plot: file, axis label, and where results.json keeps
# the valid and test values (cqk's evaluation_report.h).
FINAL_METRICS = (
    ("ppl_bars.png", "perplexity", lambda results, split: results.get(f"{split}_ppl")),
    ("bpb_bars.png", "bits per byte", lambda results, split: (results.get(split) or {}).get("bpb")),
)


def final_values(runs, value_of, split):
    """The metric of each run that reports it as a number."""
    values = [value_of(run["results"], split) for run in runs]
    return np.array([v for v in values if isinstance(v, (int, float))], dtype=float)


def plot_final(variants, out, label, value_of):
    """Bars of the valid and test values per variant (mean ± sd over seeds).
    Returns False, writing nothing, when no run reports the metric."""
    names = [n for n in variants if any(len(final_values(variants[n], value_of, s)) for s in ("valid", "test"))]
    if not names:
        return False
    x = np.arange(len(names))
    width = 0.38
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(names) + 2), 5))
    shown = []
    for offset, split in ((-width / 2, "valid"), (width / 2, "test")):
        values = [final_values(variants[n], value_of, split) for n in names]
        means = [v.mean() if len(v) else np.nan for v in values]
        sds = [v.std(ddof=1) if len(v) > 1 else 0.0 for v in values]
        bars = ax.bar(x + offset, means, width, yerr=sds, capsize=4, label=split)
        ax.bar_label(bars, labels=[f"{m:.3f}" for m in means], label_type="center", fontsize=7, color="white")
        shown.extend(np.concatenate(values))
    ax.set_xticks(x, [f"{n}\nn={len(variants[n])}" for n in names], fontsize=8)
    ax.set_ylabel(label)
    ax.set_title(f"Final {label} (mean ± sd over seeds)")
    # Variants differ by a few percent: start the axis near the smallest bar, not at 0.
    ax.set_ylim(min(shown) * 0.95, max(shown) * 1.03)
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for the PNGs (default: .)")
    parser.add_argument("--band", choices=("minmax", "sd"), default="minmax",
                        help="band over seeds around the mean loss (default: minmax)")
    parser.add_argument("--smooth", type=int, default=1, metavar="K",
                        help="moving average over K logged points before averaging seeds (default: 1, none)")
    args = parser.parse_args()

    variants = load_variants(args.run_dirs)
    args.out.mkdir(parents=True, exist_ok=True)
    outputs = [args.out / "loss_vs_tokens.png"]
    plot_loss(variants, outputs[0], args.band, args.smooth)
    for file, label, value_of in FINAL_METRICS:
        if plot_final(variants, args.out / file, label, value_of):
            outputs.append(args.out / file)
        else:
            print(f"plot_runs: no run reports {label}; {file} not written", file=sys.stderr)
    for path in outputs:
        print(path)


if __name__ == "__main__":
    main()
