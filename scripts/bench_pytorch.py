#!/usr/bin/env python3
"""The cqk model in plain PyTorch eager, as the reference for `cqk bench train`.

Same modules, parameter names and shapes as cqk's state dict (it loads the
weights.pt that `cqk bench train --dump DIR` writes), same initialisation
(same draws in the same order, so the same seed gives the same weights), the
trainer's AdamW groups, the same clipping and the same thread count.
Attention kinds vanilla, diff and qknorm; coupling kinds none and affine.

  # time training steps from a dump (config, initial weights, a batch):
  cqk bench train configs/bench/tiny.yaml --dump /tmp/d --warmup 0 --steps 1
  bench_pytorch.py --dump /tmp/d --threads 2 --warmup 3 --steps 10 [--json]
  # or from a config (config.json of a dump, or the JSON of `cqk bench train --json`):
  bench_pytorch.py --config /tmp/d/config.json
  # does it compute the same function? Loss of the dumped weights on the dumped batch:
  bench_pytorch.py --check-loss /tmp/d          # exit 1 when |loss - cqk's| > --tolerance
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
import torch.nn as nn
import torch.nn.functional as F


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


# --- the model (src/model.cpp, attention.cpp, coupling.cpp, headwise_mlp.cpp, rms_norm.cpp, rope.cpp) ---


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        compute = torch.promote_types(x.dtype, torch.float32)
        xf = x.to(compute)
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight).to(x.dtype)


def apply_rope(x, base):
    time_, dim = x.shape[-2], x.shape[-1]
    half = dim // 2
    inv_freq = torch.pow(base, -torch.arange(0, half, dtype=torch.float64, device=x.device) * (2.0 / dim))
    positions = torch.arange(0, time_, dtype=torch.float64, device=x.device)
    angles = torch.outer(positions, inv_freq)
    compute = torch.promote_types(x.dtype, torch.float32)
    cos = torch.cat([angles.cos(), angles.cos()], -1).to(compute)
    sin = torch.cat([angles.sin(), angles.sin()], -1).to(compute)
    xf = x.to(compute)
    rotated = torch.cat([-xf.narrow(-1, half, half), xf.narrow(-1, 0, half)], -1)
    return (xf * cos + rotated * sin).to(x.dtype)


class HeadwiseMLP(nn.Module):
    def __init__(self, groups, inp, hidden, out, zero_output):
        super().__init__()
        bound1 = 1.0 / math.sqrt(inp)
        self.w1 = nn.Parameter(torch.empty(groups, hidden, inp).uniform_(-bound1, bound1))
        self.b1 = nn.Parameter(torch.zeros(groups, hidden))
        if zero_output:
            self.w2 = nn.Parameter(torch.zeros(groups, out, hidden))
        else:
            bound2 = 1.0 / math.sqrt(hidden)
            self.w2 = nn.Parameter(torch.empty(groups, out, hidden).uniform_(-bound2, bound2))
        self.b2 = nn.Parameter(torch.zeros(groups, out))

    def forward(self, x):
        hidden = F.silu(torch.matmul(x, self.w1.transpose(-1, -2)) + self.b1.unsqueeze(-2))
        return torch.matmul(hidden, self.w2.transpose(-1, -2)) + self.b2.unsqueeze(-2)


class QKCoupling(nn.Module):
    """Kinds none and affine. Plain autograd (cqk rebuilds the inputs from the
    exact inverse in the backward instead of saving them; same gradients)."""

    def __init__(self, cfg, num_heads, head_dim):
        super().__init__()
        self.kind = cfg["kind"]
        self.clamp = float(cfg["clamp"])
        if self.kind not in ("none", "affine"):
            raise SystemExit(f"bench_pytorch.py: coupling kind '{self.kind}' is not implemented (none|affine)")
        groups = 1 if cfg["shared_across_heads"] else num_heads
        self.steps = int(cfg["steps"]) if self.kind == "affine" else 0
        for i in range(self.steps):
            self.add_module(f"conditioner{i}", HeadwiseMLP(groups, head_dim, int(cfg["hidden"]), 2 * head_dim, True))

    def transform(self, q, k):
        for i in range(self.steps):
            conditioner = getattr(self, f"conditioner{i}")
            if i % 2 == 0:  # k from q
                s, t = conditioner(q).chunk(2, -1)
                k = k * torch.exp(torch.tanh(s / self.clamp) * self.clamp) + t
            else:  # q from k
                s, t = conditioner(k).chunk(2, -1)
                q = q * torch.exp(torch.tanh(s / self.clamp) * self.clamp) + t
        return q, k

    def forward(self, q, k):
        if self.steps == 0:
            return q, k
        if q.dtype in (torch.bfloat16, torch.float16):  # the map runs in float32 (as in cqk)
            with torch.autocast(q.device.type, enabled=False):
                qf, kf = self.transform(q.float(), k.float())
            return qf.to(q.dtype), kf.to(k.dtype)
        return self.transform(q, k)


def differential_lambda_init(layer):
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


class Attention(nn.Module):
    def __init__(self, cfg, layer):
        super().__init__()
        width, heads = cfg["width"], cfg["heads"]
        a = cfg["attention"]
        self.kind = a["kind"]
        if self.kind not in ("vanilla", "diff", "qknorm"):
            raise SystemExit(f"bench_pytorch.py: attention kind '{self.kind}' is not implemented (vanilla|diff|qknorm)")
        self.heads = heads
        self.head_dim = width // heads
        self.kv_heads = cfg["kv_heads"] or heads
        self.rope_base = cfg["rope_base"]
        self.separate_pairs = a["coupling"]["separate_pairs"]
        # The order of construction is cqk's, so the random draws match.
        self.q_proj = nn.Linear(width, width, bias=False)
        self.k_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.out_proj = nn.Linear(width, width, bias=False)
        diff = self.kind == "diff"
        coupling_heads = heads // 2 if diff and not self.separate_pairs else heads
        self.coupling = QKCoupling(a["coupling"], coupling_heads, self.head_dim)
        if self.kind == "qknorm":
            self.q_norm = RMSNorm(self.head_dim, cfg["norm_eps"])
            self.k_norm = RMSNorm(self.head_dim, cfg["norm_eps"])
        if diff:
            self.lambda_init = differential_lambda_init(layer)
            self.lambda_q1 = nn.Parameter(torch.randn(self.head_dim) * 0.1)
            self.lambda_k1 = nn.Parameter(torch.randn(self.head_dim) * 0.1)
            self.lambda_q2 = nn.Parameter(torch.randn(self.head_dim) * 0.1)
            self.lambda_k2 = nn.Parameter(torch.randn(self.head_dim) * 0.1)
            self.head_norm = RMSNorm(2 * self.head_dim, cfg["norm_eps"])

    @staticmethod
    def split_heads(x, heads):  # [B, T, H*d] -> [B, H, T, d]
        return x.view(x.size(0), x.size(1), heads, -1).transpose(1, 2)

    @staticmethod
    def merge_heads(x):  # [B, H, T, d] -> [B, T, H*d]
        return x.transpose(1, 2).reshape(x.size(0), x.size(2), -1)

    def forward(self, x):
        q = self.split_heads(self.q_proj(x), self.heads)
        k = self.split_heads(self.k_proj(x), self.kv_heads)
        if self.kind == "diff":
            return self.forward_differential(q, k, x)
        v = self.split_heads(self.v_proj(x), self.kv_heads)
        if self.kv_heads != self.heads:
            repeat = self.heads // self.kv_heads
            k = k.repeat_interleave(repeat, 1)
            v = v.repeat_interleave(repeat, 1)
        q, k = self.coupling(q, k)
        if self.kind == "qknorm":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, self.rope_base), apply_rope(k, self.rope_base)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(self.merge_heads(out))

    def forward_differential(self, q, k, x):
        batch, time_, heads, d = x.size(0), x.size(1), self.heads // 2, self.head_dim
        v = self.split_heads(self.v_proj(x), heads)  # [B, H/2, T, 2d]

        def by_pair(t):  # [B, H, T, d] -> [B, 2, H/2, T, d]
            return t.view(batch, heads, 2, time_, d).transpose(1, 2)

        if self.separate_pairs:
            q, k = self.coupling(by_pair(q).reshape(batch, 2 * heads, time_, d),
                                 by_pair(k).reshape(batch, 2 * heads, time_, d))
        else:
            q, k = self.coupling(by_pair(q).reshape(batch * 2, heads, time_, d),
                                 by_pair(k).reshape(batch * 2, heads, time_, d))
        q = apply_rope(q, self.rope_base).reshape(batch, 2, heads, time_, d)
        k = apply_rope(k, self.rope_base).reshape(batch, 2, heads, time_, d)
        a1v = F.scaled_dot_product_attention(q.select(1, 0), k.select(1, 0), v, is_causal=True)
        a2v = F.scaled_dot_product_attention(q.select(1, 1), k.select(1, 1), v, is_causal=True)
        lam = (torch.exp((self.lambda_q1 * self.lambda_k1).sum()) - torch.exp((self.lambda_q2 * self.lambda_k2).sum())
               + self.lambda_init)
        out = self.head_norm(a1v - lam.to(a1v.dtype) * a2v) * (1.0 - self.lambda_init)
        return self.out_proj(self.merge_heads(out))


def mlp_hidden(cfg):
    if cfg["mlp_hidden"] > 0:
        return cfg["mlp_hidden"]
    if cfg["mlp"] == "gelu":
        return 4 * cfg["width"]
    return (8 * cfg["width"] // 3 + 63) // 64 * 64


class MLP(nn.Module):
    def __init__(self, width, hidden, swiglu):
        super().__init__()
        self.up = nn.Linear(width, hidden, bias=False)
        self.gate = nn.Linear(width, hidden, bias=False) if swiglu else None
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x):
        if self.gate is not None:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, cfg, layer):
        super().__init__()
        self.attention_norm = RMSNorm(cfg["width"], cfg["norm_eps"])
        self.attention = Attention(cfg, layer)
        self.mlp_norm = RMSNorm(cfg["width"], cfg["norm_eps"])
        self.mlp = MLP(cfg["width"], mlp_hidden(cfg), cfg["mlp"] == "swiglu")

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.mlp(self.mlp_norm(h))


class TransformerLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        if cfg["attention"]["kind"] == "mta":
            raise SystemExit("bench_pytorch.py: attention kind 'mta' is not implemented")
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg["vocab_size"], cfg["width"])
        self.blocks = nn.ModuleList([Block(cfg, layer) for layer in range(cfg["layers"])])
        self.final_norm = RMSNorm(cfg["width"], cfg["norm_eps"])
        self.initialise()

    @torch.no_grad()
    def initialise(self):
        std = self.cfg["init_std"]
        residual_std = std / math.sqrt(2.0 * self.cfg["layers"])
        self.embedding.weight.normal_(0.0, std)
        for name, p in self.named_parameters():
            if "_proj.weight" not in name and "mlp." not in name:
                continue
            residual = "out_proj." in name or "mlp.down." in name
            p.normal_(0.0, residual_std if residual else std)

    def forward(self, tokens):
        h = self.embedding(tokens)
        for block in self.blocks:
            h = block(h)
        return torch.matmul(self.final_norm(h), self.embedding.weight.t())

    def loss(self, tokens, targets):
        logits = self.forward(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1)

    def flops_per_token(self, seq_len):
        params = sum(p.numel() for p in self.parameters())
        return 6.0 * params + 12.0 * self.cfg["layers"] * self.cfg["width"] * seq_len


def make_optimizer(model, train):
    """The trainer's AdamW (src/trainer.cpp make_optimizer): decay on matrices only."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        embedding = name.startswith("embedding.")
        matrix = p.dim() >= 2 and not embedding and "mta_" not in name
        decayed = matrix or (embedding and train["decay_embeddings"]) or (
            not matrix and not embedding and train["decay_norms_and_biases"])
        (decay if decayed else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": train["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=train["lr"], betas=(train["beta1"], train["beta2"]), eps=train["eps"])


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
    with torch.no_grad():
        loss = model.loss(batch["inputs"], batch["targets"]).item()
    diff = abs(loss - reference["loss"])
    out = {"loss_pytorch": loss, "loss_cqk": reference["loss"], "abs_diff": diff, "tolerance": args.tolerance,
           "ok": diff <= args.tolerance, "after_steps": reference.get("after_steps"), "tensors": len(weights)}
    if reference.get("after_steps") == 0:
        # The same seed and the same draws in the same order should give the same initial weights.
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
    optimizer = make_optimizer(model, train)
    params = list(model.parameters())
    accum = train["grad_accum"]
    max_norm = train["grad_clip"] if train["grad_clip"] > 0 else sys.float_info.max
    tokens_per_step = data["batch_size"] * data["seq_len"] * accum

    def step():
        optimizer.zero_grad()
        loss_value = 0.0
        for _ in range(accum):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = model.loss(inputs.to(device), targets.to(device)) / accum
            loss.backward()
            loss_value += loss.item()
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return loss_value

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
              f"{result['threads']} threads, torch {result['torch_version']}")
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
    config = read_config(args)
    if args.check_loss:
        torch.set_num_threads(choose_threads(args.threads, config["train"].get("threads", 0)))
        return check_loss(args, config)
    return bench(args, config)


if __name__ == "__main__":
    sys.exit(main())
