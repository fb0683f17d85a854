"""gpu_report.json and gpu_report.md from run.sh's stages (standard library only).

    python3 report.py WORK OUTDIR SECONDS

WORK holds stages.tsv (name, status, seconds, limit, reason per line) and one
folder per stage with the files its stage function wrote; BUNDLE, SITE,
TORCH_VERSION and GPUS come from run.sh's environment. Figures a stage did not
get to write are left out; the stage's status and reason say why.
"""
import json
import os
import sys
import time

TITLES = {
    "version": "cqk --version, binaries start, libraries resolve",
    "tests": "GPU tests",
    "kernels": "kernel table",
    "train_bench": "150M bf16 training benchmark",
    "train": "bf16 training run, checkpoint and resume",
}
# Rows of the kernel table: JSON key of cqk_kernel_bench --json, label.
PATHS = [
    ("sdpa", "SDPA, no coupling"),
    ("aten_coupling_sdpa", "ATen coupling + SDPA"),
    ("fused_coupling_sdpa", "fused coupling + SDPA"),
    ("fused_coupling_rope_sdpa", "fused coupling + RoPE + SDPA"),
    ("flash_coupled_attention", "flash coupled attention (+ RoPE)"),
]
H200_DATASHEET_BF16 = 989e12
TARGET_MFU, TARGET_RATIO = 0.45, 1.03  # issue 9's GPU targets


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def read_json(path):
    text = read(path)
    return json.loads(text) if text else None


def json_lines(path):
    return [json.loads(line) for line in (read(path) or "").splitlines() if line.startswith("{")]


def version_figures(d):
    figures = {}
    for line in (read(os.path.join(d, "version.txt")) or "").splitlines():
        key, sep, value = line.partition(": ")
        if not sep:  # "cqk 0.1.0", "libtorch 2.11.0"
            key, _, value = line.partition(" ")
        figures[key] = value
    libraries = (read(os.path.join(d, "libraries.txt")) or "").split("\n")
    origin = {"bundle": [], "torch": [], "system": []}
    for soname, _, path in (line.partition(" ") for line in libraries if line):
        if path.startswith(os.environ.get("BUNDLE", "?") + "/"):
            origin["bundle"].append(soname)
        elif path.startswith(os.environ.get("SITE", "?") + "/"):
            origin["torch"].append(soname)
        else:
            origin["system"].append(f"{soname} ({path})")
    if libraries != [""]:
        figures["libraries"] = origin
    return figures


def tests_figures(d):
    report = read_json(os.path.join(d, "tests.json"))
    if not report:
        return {}
    cases = [(s["name"] + "." + t["name"], t) for s in report["testsuites"] for t in s["testsuite"]]
    failed = [name for name, t in cases if t.get("failures")]
    return {
        "tests": len(cases),
        "failed": failed,
        "skipped": [name for name, t in cases if t.get("result") == "SKIPPED"],
        "seconds": {name: float(t.get("time", "0s").rstrip("s")) for name, t in cases},
    }


def kernels_figures(d):
    rows = []
    for raw in json_lines(os.path.join(d, "rows.jsonl")):
        sdpa = raw["sdpa"]
        paths = {}
        for key, _ in PATHS:
            t = raw[key]
            if not t["fwd_bwd_ms"]:
                continue  # the path does not apply at this shape
            paths[key] = {
                "fwd_ms": t["fwd_ms"],
                "fwd_tflops": raw["fwd_flops"] / (t["fwd_ms"] * 1e-3) / 1e12,
                "fwd_vs_sdpa": t["fwd_ms"] / sdpa["fwd_ms"],
                "fwd_bwd_ms": t["fwd_bwd_ms"],
                "fwd_bwd_tflops": raw["fwd_bwd_flops"] / (t["fwd_bwd_ms"] * 1e-3) / 1e12,
                "fwd_bwd_vs_sdpa": t["fwd_bwd_ms"] / sdpa["fwd_bwd_ms"],
            }
        rows.append({"shape": {k: raw[k] for k in ("dtype", "T", "batch", "heads", "dim", "hidden", "steps")},
                     "paths": paths, "raw": raw})
    return {"rows": rows} if rows else {}


def train_bench_figures(d):
    bench = read_json(os.path.join(d, "bench.json"))
    if not bench:
        return {}

    def model(r):
        return {
            "config": r["name"], "device": r["device_name"], "dtype": r["dtype"], "params": r["params"],
            "tokens_per_step": r["tokens_per_step"], "tokens_per_s": r["tokens_per_s"],
            "step_ms": 1e3 * r["step_time_s"]["median"], "mfu_datasheet": r["mfu_datasheet"],
            "datasheet_peak_flops": r["datasheet_peak_flops"], "mfu_measured": r["mfu_measured"],
            "measured_peak_flops": r["measured_peak_flops"], "cuda_peak_bytes": r["cuda_peak_bytes"],
            # Against the H100/H200 datasheet whatever the device (mfu_datasheet: known devices only).
            "mfu_989": r["achieved_flops"] / H200_DATASHEET_BF16,
        }

    ratio = bench["step_time_ratio"]
    return {"coupled": model(bench["a"]), "base": model(bench["b"]),
            "coupled_over_base": {"median": ratio["median"], "min": ratio["min"], "max": ratio["max"],
                                  "per_step": bench["step_time_ratios"]},
            "targets": {"mfu": TARGET_MFU, "coupled_over_base": TARGET_RATIO}}


def train_figures(d):
    run = os.path.join(d, "run")
    losses = [(m["step"], m["loss"]) for m in json_lines(os.path.join(run, "metrics.jsonl")) if "loss" in m]
    figures = {}
    if losses:
        figures.update(first_step=losses[0][0], first_loss=losses[0][1], last_step=losses[-1][0],
                       last_loss=losses[-1][1], losses=losses)
    results = read_json(os.path.join(run, "results.json"))
    if results:
        figures.update(valid=results["valid"], test=results["test"])
    log = read(os.path.join(d, "log")) or ""
    figures["resumed_at_step_150"] = "at step 150" in log and "resumed from" in log
    return figures


def md_version(v):
    lines = [f"- {k}: {val}" for k, val in v.items() if k != "libraries"]
    if "libraries" in v:
        lib = v["libraries"]
        lines.append(f"- libraries: {len(lib['bundle'])} from the bundle, {len(lib['torch'])} from torch's wheels, "
                     f"from the system: {', '.join(lib['system']) or 'none'}")
    return ["## Versions", ""] + lines


def md_tests(t):
    return ([f"## GPU tests: {t['tests']} run, {len(t['failed'])} failed, {len(t['skipped'])} skipped", ""]
            + [f"- FAILED {name}" for name in t["failed"]] + [f"- skipped {name}" for name in t["skipped"]])


def md_kernels(k):
    s = k["rows"][0]["shape"]
    lines = [f"## Kernels: {s['dtype']}, batch {s['batch']}, heads {s['heads']}, hidden {s['hidden']}, "
             f"{s['steps']} steps, causal; medians (ms); TFLOP/s of the attention's FLOPs", "",
             "| head dim | T | path | fwd ms | TFLOP/s | / SDPA | fwd+bwd ms | TFLOP/s | / SDPA |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in k["rows"]:
        for key, label in PATHS:
            if key in row["paths"]:
                p = row["paths"][key]
                lines.append(f"| {row['shape']['dim']} | {row['shape']['T']} | {label} | {p['fwd_ms']:.3f} | "
                             f"{p['fwd_tflops']:.0f} | {p['fwd_vs_sdpa']:.2f} | {p['fwd_bwd_ms']:.3f} | "
                             f"{p['fwd_bwd_tflops']:.0f} | {p['fwd_bwd_vs_sdpa']:.2f} |")
    return lines


def md_train_bench(b):
    lines = ["## Training benchmark: 150M, bf16, steps alternated in one process", "",
             "| config | tokens/s | step ms | MFU vs 989 TFLOP/s | MFU vs measured bf16 matmul |", "|---|---|---|---|---|"]
    for c in (b["coupled"], b["base"]):
        lines.append(f"| {c['config']} | {c['tokens_per_s']:,.0f} | {c['step_ms']:.1f} | {100 * c['mfu_989']:.1f}% | "
                     f"{100 * c['mfu_measured']:.1f}% of {c['measured_peak_flops'] / 1e12:.0f} TFLOP/s |")
    r = b["coupled_over_base"]
    return lines + ["", f"Coupled/base step time {r['median']:.3f} ({r['min']:.3f}..{r['max']:.3f}); targets: "
                        f"MFU >= {100 * TARGET_MFU:.0f}%, coupled/base <= {TARGET_RATIO}."]


def md_train(t):
    if "first_loss" not in t:
        return []
    line = (f"Loss {t['first_loss']:.3f} (step {t['first_step']}) -> {t['last_loss']:.3f} (step {t['last_step']}); "
            f"resumed at step 150: {'yes' if t['resumed_at_step_150'] else 'no'}")
    if "valid" in t:
        line += f"; valid ppl {t['valid']['ppl']:.3f}, accuracy {t['valid']['accuracy']:.3f}"
    return ["## Training run: default config, bf16 on CUDA, 150 steps, then resumed to 300", "", line + "."]


FIGURES = {"version": version_figures, "tests": tests_figures, "kernels": kernels_figures,
           "train_bench": train_bench_figures, "train": train_figures}
SECTIONS = {"version": md_version, "tests": md_tests, "kernels": md_kernels, "train_bench": md_train_bench,
            "train": md_train}


def markdown(report):
    m = report["machine"]
    lines = [f"# GPU check, {report['date']}: {m['gpu'] or 'no CUDA device'}", "",
             f"Bundle {report['bundle'].get('commit', '?')}, torch {m['torch']} from {m['site']}, {m['gpus']} GPUs; "
             f"{report['seconds']} s in all.", "",
             "| stage | status | seconds (limit) | reason |", "|---|---|---|---|"]
    for s in report["stages"]:
        lines.append(f"| {s['name']}: {s['title']} | **{s['status']}** | {s['seconds']} ({s['limit_s']}) "
                     f"| {s['reason']} |")
    for s in report["stages"]:
        if not s["figures"] or s["name"] not in SECTIONS:
            continue
        try:
            section = SECTIONS[s["name"]](s["figures"])
        except (KeyError, IndexError, TypeError, ValueError) as e:  # the figures are in the JSON all the same
            section = [f"## {s['name']}", "", f"(not shown: {type(e).__name__} {e}; see gpu_report.json)"]
        lines += [""] + section if section else []
    return "\n".join(lines) + "\n"


def figures_of(name, d):
    try:
        return FIGURES[name](d) if name in FIGURES else {}
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as e:  # files cut short by a failure
        return {"error": f"{type(e).__name__}: {e}"}


def main(work, outdir, seconds):
    stages = []
    for line in (read(os.path.join(work, "stages.tsv")) or "").splitlines():
        name, status, secs, limit, reason = line.split("\t")
        stages.append({"name": name, "title": TITLES.get(name, name), "status": status, "seconds": int(secs),
                       "limit_s": int(limit), "reason": reason,
                       "figures": figures_of(name, os.path.join(work, name))})
    bundle = dict(line.split(" ", 1) for line in (read(os.path.join(os.environ.get("BUNDLE", ""), "BUILD_INFO"))
                                                  or "").splitlines() if " " in line)
    version = next((s["figures"] for s in stages if s["name"] == "version"), {})
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": int(seconds),
        "passed": all(s["status"] != "FAILED" for s in stages),
        "bundle": bundle,
        "machine": {"torch": os.environ.get("TORCH_VERSION") or None, "site": os.environ.get("SITE") or None,
                    "gpus": int(os.environ.get("GPUS") or 0), "gpu": version.get("gpu 0")},
        "stages": stages,
    }
    with open(os.path.join(outdir, "gpu_report.json"), "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    with open(os.path.join(outdir, "gpu_report.md"), "w") as f:
        f.write(markdown(report))


if __name__ == "__main__":
    main(*sys.argv[1:4])
