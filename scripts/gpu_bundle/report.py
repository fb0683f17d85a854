"""gpu_report.json and gpu_report.md from run.sh's state (standard library only).

    python3 report.py WORK OUTDIR SECONDS STATE

run.sh calls it at its start, as each stage starts and ends, and when a
signal stops it (STATE: running, finished or interrupted). Both files are written
aside and renamed into place, so a reader never finds half a report.

WORK holds stages.tsv (name, status, seconds, limit, reason of each selected
stage; status PENDING, RUNNING, PASSED, FAILED, SKIPPED or INTERRUPTED) and a
folder per started stage with the files its stage function wrote, parts.tsv
among them (name, status, seconds, reason of each part: a test group, a timed
path, a run). BUNDLE, SITE, GPUS, LOSS_TOLERANCE and TORCH_* come from run.sh's
environment. Figures a stage did not get to write are left out; the stage's
status and reason say why.
"""
import glob
import json
import os
import re
import statistics
import sys
import time

TITLES = {
    "version": "cqk --version, binaries start, libraries resolve",
    "tests": "GPU tests, one process per group",
    "kernels": "kernel table, one process per path",
    "train_bench": "150M bf16 training benchmark",
    "train": "bf16 training at head dim 64: resume, fused against unfused",
    "sanitize": "compute-sanitizer memcheck and racecheck",
}
# cqk_kernel_bench --path names, in the table's order, and their labels.
PATHS = [
    ("sdpa", "SDPA"),
    ("sdpa-cudnn", "SDPA, cuDNN first"),
    ("rope-sdpa", "RoPE + SDPA (base)"),
    ("fused-coupling-rope", "fused coupling with RoPE + SDPA (coupled)"),
    ("fused-coupling", "fused coupling + SDPA"),
    ("aten-coupling", "ATen coupling + SDPA"),
]
SHAPE_KEYS = ("dtype", "T", "dim", "batch", "heads", "hidden", "steps")
# Above this share of the attention's time, the coupling's own round trip of q
# and k through memory would pay for a tensor-core attention kernel that runs
# the coupling in its prologue.
SHARE_WORTH_A_KERNEL = 0.05
H200_MEASURED_BF16, H200_DATASHEET_BF16 = 790e12, 989e12  # dense bf16 matmul FLOP/s
TARGET_MFU, TARGET_RATIO = 0.45, 1.03  # issue 9's GPU targets


def read(path):
    try:  # a cut multi-byte character in a failure's reason must not stop the report
        with open(path, errors="replace", newline="") as f:
            return f.read()
    except OSError:
        return None


def read_json(path):
    text = read(path)
    return json.loads(text) if text else None


def json_lines(path):
    return [json.loads(line) for line in (read(path) or "").split("\n") if line.startswith("{")]


def tsv(path):
    return [line.split("\t") for line in (read(path) or "").split("\n") if line]


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
    cases = []
    for path in sorted(glob.glob(os.path.join(d, "tests-*.json"))):  # one per group; none from a group that crashed
        report = read_json(path) or {"testsuites": []}
        cases += [(s["name"] + "." + t["name"], t) for s in report["testsuites"] for t in s["testsuite"]]
    if not cases:
        return {}
    return {
        "tests": len(cases),
        "failed": [name for name, t in cases if t.get("failures")],
        "skipped": [name for name, t in cases if t.get("result") == "SKIPPED"],
        "seconds": {name: float(t.get("time", "0s").rstrip("s")) for name, t in cases},
    }


def fwd_bwd_ms(shape, path):
    p = shape["paths"].get(path)
    return p["fwd_bwd_ms"] if p and p["applies"] and p["fwd_bwd_ms"] > 0 else None


def kernels_figures(d):
    """Rows of one path each, joined on (dtype, T, dim) into shapes."""
    shapes = {}
    for row in json_lines(os.path.join(d, "rows.jsonl")):
        shape = shapes.setdefault((row["dtype"], row["dim"], row["T"]),
                                  {k: row[k] for k in SHAPE_KEYS} | {"paths": {}})
        p = {k: v for k, v in row.items() if k not in SHAPE_KEYS and k != "path"}
        if p["applies"] and p["fwd_bwd_ms"] > 0:
            p["fwd_bwd_tflops"] = row["fwd_bwd_flops"] / (p["fwd_bwd_ms"] * 1e-3) / 1e12
        shape["paths"][row["path"]] = p
    for shape in shapes.values():
        sdpa, cudnn = fwd_bwd_ms(shape, "sdpa"), fwd_bwd_ms(shape, "sdpa-cudnn")
        if sdpa and cudnn:
            shape["cudnn_over_default"] = cudnn / sdpa
            shape["faster_sdpa"] = "cudnn" if cudnn < sdpa else "default"
        base, coupled = fwd_bwd_ms(shape, "rope-sdpa"), fwd_bwd_ms(shape, "fused-coupling-rope")
        if base and coupled:
            shape["coupling_share"] = (coupled - base) / base
    if not shapes:
        return {}
    ordered = [shapes[key] for key in sorted(shapes)]
    shares = [s["coupling_share"] for s in ordered if "coupling_share" in s]
    # The verdict is the median shape's: one noisy or host-bound row (two
    # processes' medians subtracted) must not decide it alone.
    median = statistics.median(shares) if shares else None
    return {"shapes": ordered, "share_threshold": SHARE_WORTH_A_KERNEL,
            "max_coupling_share": max(shares) if shares else None, "median_coupling_share": median,
            "share_exceeds_threshold": median > SHARE_WORTH_A_KERNEL if shares else None}


def bench_model(r):
    return {
        "config": r["name"], "device": r["device_name"], "dtype": r["dtype"], "sdpa_backend": r["sdpa_backend"],
        "params": r["params"], "tokens_per_step": r["tokens_per_step"], "tokens_per_s": r["tokens_per_s"],
        "step_ms": 1e3 * r["step_time_s"]["median"], "achieved_flops": r["achieved_flops"],
        "mfu_790": r["achieved_flops"] / H200_MEASURED_BF16, "mfu_989": r["achieved_flops"] / H200_DATASHEET_BF16,
        "mfu_measured": r["mfu_measured"], "measured_peak_flops": r["measured_peak_flops"],
        "mfu_datasheet": r["mfu_datasheet"], "datasheet_peak_flops": r["datasheet_peak_flops"],
        "cuda_peak_bytes": r["cuda_peak_bytes"],
    }


def train_bench_figures(d):
    figures = {}
    base = read_json(os.path.join(d, "base.json"))
    if base:
        figures["base_alone"] = bench_model(base)
    pair = read_json(os.path.join(d, "bench.json"))
    if pair:
        ratio = pair["step_time_ratio"]
        figures.update(coupled=bench_model(pair["a"]), base=bench_model(pair["b"]),
                       coupled_over_base={"median": ratio["median"], "min": ratio["min"], "max": ratio["max"],
                                          "per_step": pair["step_time_ratios"]},
                       fused_coupling_off=os.path.exists(os.path.join(d, "fused_off")))
    if figures:
        figures["targets"] = {"mfu": TARGET_MFU, "coupled_over_base": TARGET_RATIO}
    return figures


def train_figures(d):
    figures = {}
    for run in ("fused", "unfused"):
        losses = [(m["step"], m["loss"]) for m in json_lines(os.path.join(d, run, "metrics.jsonl")) if "loss" in m]
        if losses:
            figures[run] = {"first_loss": losses[0][1], "last_step": losses[-1][0], "last_loss": losses[-1][1],
                            "losses": losses}
        results = read_json(os.path.join(d, run, "results.json"))
        if results and run in figures:
            figures[run]["valid"] = results["valid"]
    if "fused" in figures and "unfused" in figures:
        a, b = figures["fused"]["last_loss"], figures["unfused"]["last_loss"]
        figures["last_loss_difference"] = abs(a - b) / b
        figures["tolerance"] = float(os.environ.get("LOSS_TOLERANCE", "nan"))
    resumed = re.search(r"resumed from .* at step (\d+)", read(os.path.join(d, "resume.out")) or "")
    if resumed:
        figures["resumed_at_step"] = int(resumed.group(1))
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
    s = k["shapes"][0]
    lines = [f"## Kernels: {s['dtype']}, batch {s['batch']}, heads {s['heads']}, coupling hidden {s['hidden']}, "
             f"{s['steps']} steps, causal; forward+backward medians, ms (TFLOP/s of the attention's FLOPs)", "",
             "| head dim | T | " + " | ".join(label for _, label in PATHS) + " | faster SDPA | coupling share |",
             "|---" * (len(PATHS) + 4) + "|"]
    for s in k["shapes"]:
        cells = []
        for path, _ in PATHS:
            p = s["paths"].get(path)
            cells.append("-" if not p else "did not apply" if "fwd_bwd_tflops" not in p
                         else f"{p['fwd_bwd_ms']:.3f} ({p['fwd_bwd_tflops']:.0f})")
        faster = f"{s['faster_sdpa']} (cuDNN/default {s['cudnn_over_default']:.2f})" if "faster_sdpa" in s else "-"
        share = f"{100 * s['coupling_share']:.1f}%" if "coupling_share" in s else "-"
        lines.append(f"| {s['dim']} | {s['T']} | " + " | ".join(cells) + f" | {faster} | {share} |")
    threshold = f"{100 * k['share_threshold']:.0f}%"
    if k["share_exceeds_threshold"] is None:
        verdict = "The coupling's share was not measured (RoPE + SDPA or the coupled path missing)."
    else:
        spread = (f"(median over shapes {100 * k['median_coupling_share']:.1f}%, at most "
                  f"{100 * k['max_coupling_share']:.1f}%)")
        verdict = (f"The coupling's q/k round trip exceeds {threshold} of the attention's time {spread}: a "
                   "tensor-core attention kernel with the coupling in its prologue is worth building."
                   if k["share_exceeds_threshold"] else
                   f"The coupling's q/k round trip stays within {threshold} of the attention's time {spread}: a "
                   "tensor-core attention kernel with the coupling in its prologue is not worth building.")
    lines += ["", "Coupling share: (coupled - base) / base, fused coupling with RoPE + SDPA against RoPE + SDPA. "
              + verdict, "", "| head dim | T | coupling alone, ATen ms | fused ms | fused kernels fwd GB/s | bwd GB/s |",
              "|---|---|---|---|---|---|"]
    for s in k["shapes"]:
        fused, aten = s["paths"].get("fused-coupling", {}), s["paths"].get("aten-coupling", {})
        if "kernel_fwd_gbs" in fused and "coupling_fwd_bwd_ms" in aten:
            lines.append(f"| {s['dim']} | {s['T']} | {aten['coupling_fwd_bwd_ms']:.3f} | "
                         f"{fused['coupling_fwd_bwd_ms']:.3f} | {fused['kernel_fwd_gbs']:.0f} | "
                         f"{fused['kernel_bwd_gbs']:.0f} |")
    return lines


def md_train_bench(b):
    lines = ["## Training benchmark: 150M, bf16", "",
             "| config | run | tokens/s | step ms | SDPA | MFU vs 790 TFLOP/s | vs 989 | vs measured matmul |",
             "|---|---|---|---|---|---|---|---|"]
    runs = [("base_alone", "alone"), ("coupled", "alternated"), ("base", "alternated")]
    for c, run in ((b[key], run) for key, run in runs if key in b):
        lines.append(f"| {c['config']} | {run} | {c['tokens_per_s']:,.0f} | {c['step_ms']:.1f} | {c['sdpa_backend']} | "
                     f"{100 * c['mfu_790']:.1f}% | {100 * c['mfu_989']:.1f}% | "
                     f"{100 * c['mfu_measured']:.1f}% of {c['measured_peak_flops'] / 1e12:.0f} TFLOP/s |")
    if "coupled_over_base" in b:
        r = b["coupled_over_base"]
        lines += ["", f"Coupled/base step time {r['median']:.3f} ({r['min']:.3f}..{r['max']:.3f})"
                      + ("; **fused coupling off after a failure** (CQK_FUSED_COUPLING=0)"
                         if b["fused_coupling_off"] else "") + "."]
    return lines + ["", f"Targets: MFU >= {100 * TARGET_MFU:.0f}%, coupled/base <= {TARGET_RATIO}."]


def md_train(t):
    lines = ["## Training run: default config at head dim 64 (width 256, 4 heads), bf16, 50 steps", ""]
    for run, label in (("fused", "fused coupling, paused at 25 and resumed"), ("unfused", "CQK_FUSED_COUPLING=0")):
        if run in t:
            r = t[run]
            lines.append(f"- {label}: loss {r['first_loss']:.4f} -> {r['last_loss']:.4f} (step {r['last_step']})")
    if "last_loss_difference" in t:
        lines.append(f"- last losses {100 * t['last_loss_difference']:.2f}% apart (tolerance "
                     f"{100 * t['tolerance']:.0f}%)")
    lines.append(f"- resumed at step {t.get('resumed_at_step', 'none')}")
    return lines


FIGURES = {"version": version_figures, "tests": tests_figures, "kernels": kernels_figures,
           "train_bench": train_bench_figures, "train": train_figures}
SECTIONS = {"version": md_version, "tests": md_tests, "kernels": md_kernels, "train_bench": md_train_bench,
            "train": md_train}


def markdown(report):
    m = report["machine"]
    lines = [f"# GPU check, {report['date']}: {m['gpu'] or 'no CUDA device'}", "",
             f"Bundle {report['bundle'].get('commit', '?')}; torch {m['torch']} from {m['python']}, {m['gpus']} GPUs; "
             f"{report['state']} after {report['seconds']} s.", ""]
    if m["torch_error"]:
        lines += [f"**Torch: {m['torch_error']}** (run.sh exits 3).", ""]
    lines += ["| stage | status | seconds (limit) | reason |", "|---|---|---|---|"]
    for s in report["stages"]:
        lines.append(f"| {s['name']}: {s['title']} | **{s['status']}** | {s['seconds']} ({s['limit_s']}) "
                     f"| {s['reason']} |")
    parts = [(s["name"], p) for s in report["stages"] for p in s["parts"]]
    if parts:
        lines += ["", "| stage | part | status | seconds | reason |", "|---|---|---|---|---|"]
        lines += [f"| {name} | {p['name']} | {p['status']} | {p['seconds']} | {p['reason']} |" for name, p in parts]
    for s in report["stages"]:
        if not s["figures"] or s["name"] not in SECTIONS:
            continue
        try:
            section = SECTIONS[s["name"]](s["figures"])
        except (KeyError, IndexError, TypeError, ValueError) as e:  # the figures are in the JSON all the same
            section = [f"## {s['name']}", "", f"(not shown: {type(e).__name__} {e}; see gpu_report.json)"]
        lines += [""] + section
    return "\n".join(lines) + "\n"


def figures_of(name, d):
    try:
        return FIGURES[name](d) if name in FIGURES else {}
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as e:  # files cut short by a failure
        return {"error": f"{type(e).__name__}: {e}"}


def write(path, text):
    aside = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(aside, "w") as f:
        f.write(text)
    os.replace(aside, path)


def parts_of(d):
    """A stage's parts.tsv; a line cut short by a killed stage is kept as it reads."""
    parts = []
    for fields in tsv(os.path.join(d, "parts.tsv")):
        if len(fields) == 4 and fields[2].isdigit():
            parts.append({"name": fields[0], "status": fields[1], "seconds": int(fields[2]), "reason": fields[3]})
        else:
            parts.append({"name": fields[0], "status": "UNKNOWN", "seconds": 0, "reason": "\t".join(fields[1:])})
    return parts


def main(work, outdir, seconds, state):
    stages = []
    for name, status, secs, limit, reason in tsv(os.path.join(work, "stages.tsv")):
        d = os.path.join(work, name)
        parts = parts_of(d)
        stages.append({"name": name, "title": TITLES.get(name, name), "status": status, "seconds": int(secs),
                       "limit_s": int(limit), "reason": reason, "parts": parts, "figures": figures_of(name, d)})
    bundle = dict(line.split(" ", 1) for line in (read(os.path.join(os.environ.get("BUNDLE", ""), "BUILD_INFO"))
                                                  or "").splitlines() if " " in line)
    version = next((s["figures"] for s in stages if s["name"] == "version"), {})
    env = os.environ.get
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "state": state,
        "seconds": int(seconds),
        "passed": state == "finished" and not env("TORCH_ERROR") and all(s["status"] in ("PASSED", "SKIPPED")
                                                                      for s in stages),
        "bundle": bundle,
        "machine": {"python": env("TORCH_PYTHON") or None, "torch": env("TORCH_VERSION") or None,
                    "torch_needed": env("TORCH_NEEDED") or None, "torch_error": env("TORCH_ERROR") or None,
                    "site": env("SITE") or None, "gpus": int(env("GPUS") or 0), "gpu": version.get("gpu 0")},
        "stages": stages,
    }
    write(os.path.join(outdir, "gpu_report.json"), json.dumps(report, indent=1) + "\n")
    write(os.path.join(outdir, "gpu_report.md"), markdown(report))


if __name__ == "__main__":
    main(*sys.argv[1:5])
