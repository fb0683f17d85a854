#!/usr/bin/env python3
"""The cqk model in plain PyTorch eager, as the reference for `cqk bench train`.

The model is python/cqk_hf/cqk_model.py: same modules, parameter names and
shapes as cqk's state dict (it loads the weights.pt that `cqk bench train
--dump DIR` writes), same initialisation (each parameter keyed by the seed
and its name, so the same seed gives the same weights); here the trainer's
AdamW groups (the dump's optimizer.json, written by cqk), the same clipping
and the same thread count. Every attention and coupling kind.

  # time training steps from a dump (config, initial weights, a batch):
  cqk bench train configs/bench/tiny.yaml --dump /tmp/d --warmup 0 --steps 1
  bench_pytorch.py --dump /tmp/d --threads 2 --warmup 3 --steps 10 [--json]
  # or from a config (config.json of a dump, or the JSON of `cqk bench train --json`):
  bench_pytorch.py --config /tmp/d/config.json
  # does it compute the same function? Loss of the dumped weights on the dumped batch:
  bench_pytorch.py --check-loss /tmp/d          # exit 1 when |loss - cqk's| > --tolerance
  # the compiled peer: torch.compile of the loss, AdamW(fused=True); the first
  # step (which compiles forward and backward) is timed apart as compile_s:
  bench_pytorch.py --dump /tmp/d --compile --fused-adamw [--compile-mode max-autotune-no-cudagraphs]
  # is the compiled loss cqk's, and are its gradients eager's?
  bench_pytorch.py --check-loss /tmp/d --compile
  # where does the time go (torch profiler, CPU self time per op):
  bench_pytorch.py --dump /tmp/d --profile 3
"""
import argparse
import json
import math
import os
import resource
import sys
import time

import torch

# The model lives in python/cqk_hf/cqk_model.py (also the code of `cqk export`'s folders).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "cqk_hf"))
from cqk_model import TransformerLM  # noqa: E402


def load_pickled(path):
    """Reads a dict of tensors that cqk wrote with torch::pickle_save (c10::Dict).

    Such a dict carries a type tag (torch.jit._pickle.restore_type_tag), which
    torch.load's weights_only unpickler does not allow by default; allowing that
    one function keeps weights_only=True.
    """
    try:
        return torch.load(path, map_location="cpu")
    except Exception:  # noqa: BLE001 - the weights_only refusal is an UnpicklingError
        import torch.jit._pickle as jit_pickle

        with torch.serialization.safe_globals([jit_pickle.restore_type_tag]):
            return torch.load(path, map_location="cpu")


def make_optimizer(model, train, groups, fused=False):
    """The trainer's AdamW over the trainer's own parameter groups (`groups`: the
    "optimizer_groups" cqk writes, src/train/train_step.cpp optimizer_groups: weight
    decay, lr scale and parameter names per group), so that both optimise alike.
    fused: PyTorch's single-kernel AdamW, the optimizer a speed-minded researcher picks."""
    named = dict(model.named_parameters())
    grouped = [name for g in groups for name in g["params"]]
    if sorted(grouped) != sorted(named):
        raise SystemExit("bench_pytorch.py: the optimizer groups do not name the model's parameters "
                         f"(missing {sorted(set(named) - set(grouped))[:3]}, unknown {sorted(set(grouped) - set(named))[:3]})")
    torch_groups = [{"params": [named[n] for n in g["params"]], "weight_decay": g["weight_decay"],
                     "lr": train["lr"] * g["lr_scale"]} for g in groups if g["params"]]
    return torch.optim.AdamW(torch_groups, lr=train["lr"], betas=(train["beta1"], train["beta2"]), eps=train["eps"],
                             fused=True if fused else None)


def loss_function(model, args):
    """model.loss, or torch.compile of it (inductor; mode None is torch's default)."""
    if not args.compile:
        return model.loss
    return torch.compile(model.loss, mode=None if args.compile_mode == "default" else args.compile_mode)


# --- the benchmark ----------------------------------------------------------------


def available_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def choose_threads(requested, config_threads):
    """cqk's rule (src/runtime.cpp): --threads, then $CQK_NUM_THREADS, then train.threads, then all cores."""
    if requested and requested > 0:
        return requested
    env = int(os.environ.get("CQK_NUM_THREADS", "0") or 0)
    if env > 0:
        return env
    if config_threads > 0:
        return config_threads
    return available_cpus()


def choose_device(name):
    cuda = torch.cuda.is_available()
    if name == "cuda" and not cuda:
        raise SystemExit("bench_pytorch.py: train.device cuda requested but no GPU is visible")
    if name == "cpu" or (name == "auto" and not cuda):
        return torch.device("cpu")
    return torch.device("cuda", 0)


def use_bf16(dtype, device):
    if dtype == "auto":
        return device.type == "cuda"
    return dtype == "bf16"


def cpu_model_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def reset_peak_rss():
    """Lowers VmHWM to the current RSS (Linux /proc/self/clear_refs), as cqk does before its timed steps."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_bytes():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cpu_snapshot():
    """(machine busy CPU seconds from /proc/stat or None, this process's CPU seconds, wall time)."""
    busy = None
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        if fields[0] == "cpu":
            user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
            busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return busy, usage.ru_utime + usage.ru_stime, time.perf_counter()


def other_cpu_load(start, end):
    """Cores' worth of CPU other processes used between two snapshots (as cqk reports it)."""
    if start[0] is None or end[0] is None or end[2] <= start[2]:
        return None
    return max(0.0, ((end[0] - start[0]) - (end[1] - start[1])) / (end[2] - start[2]))


def percentile(sorted_values, q):
    if not sorted_values:
        return 0.0
    position = q * (len(sorted_values) - 1)
    lo = int(math.floor(position))
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (position - lo) * (sorted_values[hi] - sorted_values[lo])


def spread(values):
    s = sorted(values)
    return {"median": percentile(s, 0.5), "min": s[0], "max": s[-1], "p25": percentile(s, 0.25),
            "p75": percentile(s, 0.75), "mean": sum(s) / len(s)}


def read_config(args):
    if args.dump:
        path = os.path.join(args.dump, "config.json")
    elif args.check_loss:
        path = os.path.join(args.check_loss, "config.json")
    elif args.config:
        path = args.config
    else:
        raise SystemExit("bench_pytorch.py: give --dump DIR, --check-loss DIR or --config FILE.json")
    with open(path) as f:
        config = json.load(f)
    if "config" in config and "model" not in config:  # the JSON of `cqk bench train --json`
        config = config["config"]
    if config["model"]["vocab_size"] <= 0:
        config["model"]["vocab_size"] = config["data"]["recall"]["vocab_size"]
    return config


def read_optimizer_groups(args):
    """The trainer's optimizer groups, from where read_config reads the config: a
    dump's optimizer.json, or with --config the "optimizer_groups" of `cqk bench
    train --json`, else the optimizer.json beside the given config.json."""
    if args.dump:
        path = os.path.join(args.dump, "optimizer.json")
    else:
        with open(args.config) as f:
            given = json.load(f)
        if "optimizer_groups" in given:
            return given["optimizer_groups"]
        path = os.path.join(os.path.dirname(args.config), "optimizer.json")
    if not os.path.exists(path):
        raise SystemExit(f"bench_pytorch.py: no optimizer groups ({path} is missing): give the folder of "
                         "`cqk bench train --dump DIR`, or the output of `cqk bench train --json`")
    with open(path) as f:
        return json.load(f)


def loss_and_grads(model, loss_fn, inputs, targets):
    """The loss and every parameter's gradient (zeros where a parameter gets none)."""
    model.zero_grad(set_to_none=True)
    loss = loss_fn(inputs, targets)
    loss.backward()
    grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return loss.item(), grads


def check_loss(args, config):
    torch.manual_seed(config["run"]["seed"])
    model = TransformerLM(config["model"])
    own_init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    weights = load_pickled(os.path.join(args.check_loss, "weights.pt"))
    missing = sorted(set(own_init) - set(weights))
    unexpected = sorted(set(weights) - set(own_init))
    if missing or unexpected:
        raise SystemExit(f"bench_pytorch.py: state dicts differ: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.load_state_dict(weights, strict=True)
    batch = load_pickled(os.path.join(args.check_loss, "batch.pt"))
    with open(os.path.join(args.check_loss, "reference.json")) as f:
        reference = json.load(f)
    model.train()
    inputs, targets = batch["inputs"], batch["targets"]
    compiled = {}
    if args.compile:
        # With gradients, so the checked graph is the one the benchmark runs (forward and backward).
        eager_loss, eager_grads = loss_and_grads(model, model.loss, inputs, targets)
        loss, grads = loss_and_grads(model, loss_function(model, args), inputs, targets)
        scale = max(max(g.abs().max().item() for g in eager_grads), 1e-30)
        grad_diff = max((a - b).abs().max().item() for a, b in zip(grads, eager_grads)) / scale
        compiled = {"compile_mode": args.compile_mode, "loss_eager": eager_loss,
                    "compiled_vs_eager_abs_diff": abs(loss - eager_loss),
                    "grad_max_rel_diff": grad_diff, "grad_tolerance": args.grad_tolerance}
    else:
        with torch.no_grad():
            loss = model.loss(inputs, targets).item()
    with open(os.path.join(args.check_loss, "reference.json")) as f:
        reference = json.load(f)
    diff = abs(loss - reference["loss"])
    ok = diff <= args.tolerance and compiled.get("grad_max_rel_diff", 0.0) <= args.grad_tolerance
    out = {"loss_pytorch": loss, "loss_cqk": reference["loss"], "abs_diff": diff, "tolerance": args.tolerance,
           "ok": ok, "after_steps": reference.get("after_steps"), "tensors": len(weights), **compiled}
    if reference.get("after_steps") == 0:
        # The same seed gives every parameter the same keyed draw: the same initial weights.
        out["init_max_abs_diff"] = max((own_init[k] - weights[k]).abs().max().item() for k in weights)
    print(json.dumps(out))
    return 0 if out["ok"] else 1


def bench(args, config):
    model_cfg, data, train = config["model"], config["data"], config["train"]
    threads = choose_threads(args.threads, train.get("threads", 0))
    torch.set_num_threads(threads)
    device = choose_device(train["device"])
    bf16 = use_bf16(train["dtype"], device)
    torch.manual_seed(config["run"]["seed"])
    model = TransformerLM(model_cfg)
    if args.dump:
        model.load_state_dict(load_pickled(os.path.join(args.dump, "weights.pt")), strict=True)
        batch = load_pickled(os.path.join(args.dump, "batch.pt"))
        inputs, targets = batch["inputs"], batch["targets"]
    else:  # random tokens, every position scored
        g = torch.Generator().manual_seed(config["run"]["seed"])
        shape = (data["batch_size"], data["seq_len"])
        inputs = torch.randint(0, model_cfg["vocab_size"], shape, generator=g)
        targets = torch.randint(0, model_cfg["vocab_size"], shape, generator=g)
    model.to(device)
    model.train()
    optimizer = make_optimizer(model, train, read_optimizer_groups(args), fused=args.fused_adamw)
    loss_fn = loss_function(model, args)
    params = list(model.parameters())
    accum = train["grad_accum"]
    max_norm = train["grad_clip"] if train["grad_clip"] > 0 else sys.float_info.max
    tokens_per_step = data["batch_size"] * data["seq_len"] * accum

    def step():
        optimizer.zero_grad()
        loss_value = 0.0
        for _ in range(accum):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = loss_fn(inputs.to(device), targets.to(device)) / accum
            loss.backward()
            loss_value += loss.item()
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return loss_value

    compile_s = None
    if args.compile:  # one step apart: the first call compiles the forward, the first backward the backward
        start = time.perf_counter()
        step()
        compile_s = time.perf_counter() - start
    for _ in range(args.warmup):
        step()
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(args.profile):
                step()
        key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=args.profile_rows))
        return 0

    reset_peak_rss()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds, losses = [], []
    cpu_start = cpu_snapshot()
    for _ in range(args.steps):
        start = time.perf_counter()
        losses.append(step())
        seconds.append(time.perf_counter() - start)
    cpu_end = cpu_snapshot()
    timed = cpu_end[2] - cpu_start[2]
    s = spread(seconds)
    flops_per_token = model.flops_per_token(data["seq_len"])
    tokens_per_s = tokens_per_step / max(s["median"], 1e-12)
    result = {
        "tool": "pytorch",
        "name": config["run"]["name"],
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model_name(),
        "dtype": "bf16" if bf16 else "fp32",
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "compile_mode": args.compile_mode if args.compile else None,
        "compile_s": compile_s,  # the first step, compile included; not in the timed steps
        "fused_adamw": args.fused_adamw,
        "params": sum(p.numel() for p in params),
        "tokens_per_step": tokens_per_step,
        "warmup": args.warmup,
        "steps": args.steps,
        "step_seconds": seconds,
        "step_time_s": s,
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_mean": tokens_per_step * args.steps / max(timed, 1e-12),
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "other_cpu_load": other_cpu_load(cpu_start, cpu_end),
        "peak_rss_bytes": peak_rss_bytes(),  # over the timed steps
        "cuda_peak_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "flops_per_token": flops_per_token,
        "achieved_flops": tokens_per_s * flops_per_token,
    }
    if args.json:
        print(json.dumps(result))
    else:
        ms = 1e3
        print(f"pytorch {result['name']}: {result['device']} ({result['device_name']}), {result['dtype']}, "
              f"{result['threads']} threads, torch {result['torch_version']}, "
              f"{'torch.compile (' + args.compile_mode + ')' if args.compile else 'eager'}, "
              f"{'fused ' if args.fused_adamw else ''}AdamW")
        if compile_s is not None:
            print(f"compile     {compile_s:.1f} s (first step, not timed)")
        print(f"params {result['params'] / 1e6:.3f}M | {tokens_per_step} tokens/step | "
              f"{args.warmup} warm-up + {args.steps} timed steps")
        print(f"step time   median {s['median'] * ms:.2f} ms | min {s['min'] * ms:.2f} | max {s['max'] * ms:.2f} | "
              f"IQR {s['p25'] * ms:.2f}..{s['p75'] * ms:.2f} ms")
        print(f"throughput  {tokens_per_s:.0f} tokens/s (median step) | {result['tokens_per_s_mean']:.0f} tokens/s (mean)")
        print(f"memory      peak RSS {result['peak_rss_bytes'] / 2**20:.1f} MiB")
        print(f"loss        {losses[0]:.4f} (first timed step) -> {losses[-1]:.4f} (last)")
        if result["other_cpu_load"] is not None:
            print(f"machine     other processes used {result['other_cpu_load']:.2f} cores during the timed steps")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dump", metavar="DIR", help="folder written by `cqk bench train --dump DIR` "
                        "(config, initial weights and the batch to train on)")
    parser.add_argument("--config", metavar="FILE", help="config.json of a dump, or the output of cqk bench --json")
    parser.add_argument("--check-loss", metavar="DIR", help="compare the loss of the dump's weights on its batch "
                        "with cqk's (reference.json); exit 1 when they differ by more than --tolerance")
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--grad-tolerance", type=float, default=1e-4, help="with --check-loss --compile: "
                        "largest |compiled - eager| gradient entry, relative to the largest eager one")
    parser.add_argument("--compile", action="store_true", help="torch.compile the loss (forward and backward)")
    parser.add_argument("--compile-mode", choices=("default", "max-autotune-no-cudagraphs"), default=None,
                        help="torch.compile mode (default: default)")
    parser.add_argument("--fused-adamw", action="store_true", help="torch.optim.AdamW(fused=True)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: $CQK_NUM_THREADS, "
                        "train.threads, or all available cores, as cqk)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="after the warm-up, profile this many steps and print the top ops")
    parser.add_argument("--profile-rows", type=int, default=25)
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 0:
        raise SystemExit("bench_pytorch.py: --steps must be >= 1 and --warmup >= 0")
    if args.compile_mode and not args.compile:
        raise SystemExit("bench_pytorch.py: --compile-mode needs --compile")
    args.compile_mode = args.compile_mode or "default"
    config = read_config(args)
    if args.check_loss:
        torch.set_num_threads(choose_threads(args.threads, config["train"].get("threads", 0)))
        return check_loss(args, config)
    return bench(args, config)


if __name__ == "__main__":
    sys.exit(main())
