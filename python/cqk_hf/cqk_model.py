"""The cqk model in plain PyTorch: the one Python home of its math.

Same modules, parameter names and shapes as cqk's state dict, and the same
initialisation (each parameter drawn from a generator keyed by the seed and its
name, src/model/initialisation.h, so the same seed gives the same weights). Used by scripts/bench_pytorch.py (the eager reference of `cqk bench
train`) and by the Hugging Face model class next to it (modeling_cqk.py), which
`cqk export` copies into an export folder; so this file imports only torch.

`cfg` is cqk's model config as a dict, with the keys of config.yaml's `model`
section (include/cqk/config.h): width, layers, heads, kv_heads, mlp,
mlp_hidden, rope_base, init_std, norm_eps, vocab_size and
attention {kind, head_norm_init, coupling {...}, mta {...}}.
Sources: src/model/model.cpp, attention.cpp, coupling.cpp, headwise_mlp.cpp,
rms_norm.cpp, rope.cpp.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

ATTENTION_KINDS = ("vanilla", "diff", "qknorm", "mta")
COUPLING_KINDS = ("none", "affine", "noninvertible", "uncoupled", "dynamics")


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
    """Rotate-half RoPE over [..., time, dim]; angles in float64 as cqk's rope_angles."""
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
    """One small MLP per head group: [B, H, T, in] -> [B, H, T, out]; groups is H or 1."""

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

    @staticmethod
    def parameter_count(groups, inp, hidden, out):
        return groups * (hidden * inp + hidden + out * hidden + out)

    def forward(self, x):
        hidden = F.silu(torch.matmul(x, self.w1.transpose(-1, -2)) + self.b1.unsqueeze(-2))
        return torch.matmul(hidden, self.w2.transpose(-1, -2)) + self.b2.unsqueeze(-2)


def coupling_hidden_width(kind, groups, head_dim, hidden, steps):
    """Hidden width of the kind's MLPs: `hidden` for affine; for the controls the
    width whose parameter count is closest to affine's (src/model/coupling.cpp)."""
    d, g = head_dim, groups
    count = HeadwiseMLP.parameter_count
    widths = {
        "noninvertible": lambda r: count(g, 2 * d, r, 2 * d),
        "uncoupled": lambda r: 2 * count(g, d, r, d),
        "dynamics": lambda r: count(g, d, r, d) + g,
    }
    if kind not in widths:
        return hidden
    target, measure = steps * count(g, d, hidden, 2 * d), widths[kind]
    best, r = 1, 1
    while measure(r) <= 2 * target:
        if abs(measure(r) - target) < abs(measure(best) - target):
            best = r
        r += 1
    return best


class QKCoupling(nn.Module):
    """Every coupling kind cqk trains, with plain autograd (cqk rebuilds the
    inputs from the exact inverse in the backward instead of saving them; same
    gradients). q, k: [batch, heads, time, head_dim]."""

    def __init__(self, cfg, num_heads, head_dim):
        super().__init__()
        self.kind = cfg["kind"]
        if self.kind not in COUPLING_KINDS:
            raise ValueError(f"unknown coupling kind '{self.kind}' (expected {'|'.join(COUPLING_KINDS)})")
        self.clamp = float(cfg["clamp"])
        self.steps = int(cfg["steps"])
        self.symplectic = cfg.get("integrator", "symplectic") == "symplectic"
        groups = 1 if cfg["shared_across_heads"] else num_heads
        d = head_dim
        r = coupling_hidden_width(self.kind, groups, d, int(cfg["hidden"]), self.steps)
        # Output layers start at zero, as in cqk; the order of construction is cqk's.
        shapes = {"none": [], "affine": [(d, 2 * d)] * self.steps, "noninvertible": [(2 * d, 2 * d)],
                  "uncoupled": [(d, d), (d, d)], "dynamics": [(d, d)]}[self.kind]
        for i, (inp, out) in enumerate(shapes):
            self.add_module(f"conditioner{i}", HeadwiseMLP(groups, inp, r, out, True))
        if self.kind == "dynamics":
            self.dt = nn.Parameter(torch.full((groups,), float(cfg["dt_init"])))

    def conditioner(self, i):
        return getattr(self, f"conditioner{i}")

    def scale_and_shift(self, out):
        s, t = out.chunk(2, -1)
        return torch.tanh(s / self.clamp) * self.clamp, t

    def transform(self, q, k):
        if self.kind == "affine":
            for i in range(self.steps):
                if i % 2 == 0:  # k from q
                    s, t = self.scale_and_shift(self.conditioner(i)(q))
                    k = k * torch.exp(s) + t
                else:  # q from k
                    s, t = self.scale_and_shift(self.conditioner(i)(k))
                    q = q * torch.exp(s) + t
        elif self.kind == "noninvertible":
            both = torch.cat([q, k], -1)
            q, k = (both + self.conditioner(0)(both)).chunk(2, -1)
        elif self.kind == "uncoupled":
            q, k = q + self.conditioner(0)(q), k + self.conditioner(1)(k)
        elif self.kind == "dynamics":
            dt = self.dt.view(1, -1, 1, 1)
            for _ in range(self.steps):
                q_new = q + dt * k
                # Symplectic Euler uses the updated q, which makes the step invertible.
                k = k + dt * self.conditioner(0)(q_new if self.symplectic else q)
                q = q_new
        return q, k

    def forward(self, q, k):
        if self.kind == "none":
            return q, k
        if q.dtype in (torch.bfloat16, torch.float16):  # the map runs in float32 (as in cqk)
            with torch.autocast(q.device.type, enabled=False):
                qf, kf = self.transform(q.float(), k.float())
            return qf.to(q.dtype), kf.to(k.dtype)
        return self.transform(q, k)


def differential_lambda_init(layer):
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


def layer_attention_kind(cfg, layer):
    """MTA runs on layers l with (l + 1) % every == 0; the others are vanilla."""
    a = cfg["attention"]
    if a["kind"] == "mta" and (layer + 1) % int(a["mta"]["every"]) != 0:
        return "vanilla"
    return a["kind"]


class Attention(nn.Module):
    def __init__(self, cfg, layer):
        super().__init__()
        width, heads = cfg["width"], cfg["heads"]
        a = cfg["attention"]
        if a["kind"] not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention kind '{a['kind']}' (expected {'|'.join(ATTENTION_KINDS)})")
        self.kind = layer_attention_kind(cfg, layer)
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
        elif diff:
            self.lambda_init = differential_lambda_init(layer)
            self.lambda_q1 = nn.Parameter(torch.randn(self.head_dim) * 0.1)
            self.lambda_k1 = nn.Parameter(torch.randn(self.head_dim) * 0.1)
            self.lambda_q2 = nn.Parameter(torch.randn(self.head_dim) * 0.1)
            self.lambda_k2 = nn.Parameter(torch.randn(self.head_dim) * 0.1)
            self.head_norm = RMSNorm(2 * self.head_dim, cfg["norm_eps"])
        elif self.kind == "mta":
            mta = a["mta"]
            self.query_kernel, self.key_kernel, self.head_group = mta["query_kernel"], mta["key_kernel"], mta["head_group"]
            # Identity initialisation: a delta at the current query and key, no head mixing.
            kernel = torch.zeros(heads, 1, self.query_kernel, self.key_kernel)
            kernel[:, :, self.query_kernel - 1, self.key_kernel // 2] = 1.0
            self.mta_kernel = nn.Parameter(kernel)
            self.mta_mixing = nn.Parameter(torch.eye(self.head_group).repeat(heads // self.head_group, 1, 1))
            self.head_norm = RMSNorm(self.head_dim, cfg["norm_eps"])
        if hasattr(self, "head_norm"):
            # Exports made before the key existed had the papers' 1.0.
            self.head_norm.weight.data.fill_(float(a.get("head_norm_init", 1.0)))

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
            # The coupling pairs each query head with a key head, so shared keys are expanded first.
            repeat = self.heads // self.kv_heads
            k = k.repeat_interleave(repeat, 1)
            v = v.repeat_interleave(repeat, 1)
        q, k = self.coupling(q, k)
        if self.kind == "qknorm":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, self.rope_base), apply_rope(k, self.rope_base)
        if self.kind == "mta":
            out = self.multi_token_attention(q, k, v)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(self.merge_heads(out))

    def multi_token_attention(self, q, k, v):
        time_ = q.size(2)
        logits = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        future = torch.ones(time_, time_, dtype=torch.bool, device=q.device).triu(1)
        # Masked logits are zeroed before the convolution and masked again after
        # it, so no future key leaks in through the kernel's reach.
        logits = logits.masked_fill(future, 0.0)
        half_key = self.key_kernel // 2
        logits = F.pad(logits, (half_key, half_key, self.query_kernel - 1, 0))  # queries: past side only
        logits = F.conv2d(logits, self.mta_kernel.to(logits.dtype), groups=self.heads)
        weights = torch.softmax(logits.masked_fill(future, float("-inf")), -1)
        sizes = weights.shape  # [B, H, T, T] -> [B, H/g, g, T*T]: mix the g heads of each group
        grouped = weights.reshape(sizes[0], sizes[1] // self.head_group, self.head_group, -1)
        weights = torch.matmul(self.mta_mixing.to(weights.dtype).unsqueeze(0), grouped).reshape(sizes)
        return self.head_norm(torch.matmul(weights, v))

    def forward_differential(self, q, k, x):
        batch, time_, heads, d = x.size(0), x.size(1), self.heads // 2, self.head_dim
        v = self.split_heads(self.v_proj(x), heads)  # [B, H/2, T, 2d]

        def by_pair(t):  # [B, H, T, d] -> [B, 2, H/2, T, d]: heads 2i and 2i+1 are head i's two pairs
            return t.view(batch, heads, 2, time_, d).transpose(1, 2)

        # Separate couplings see the pairs as 2H heads; one shared per-head
        # coupling takes both pairs with the pair axis folded into the batch.
        shape = (batch, 2 * heads, time_, d) if self.separate_pairs else (batch * 2, heads, time_, d)
        q, k = self.coupling(by_pair(q).reshape(shape), by_pair(k).reshape(shape))
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
    # SwiGLU keeps the parameter count of a 4x GELU MLP with 2/3 of the width, rounded up to 64.
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
        if cfg["mlp"] not in ("gelu", "swiglu"):
            raise ValueError(f"unknown mlp '{cfg['mlp']}' (expected gelu|swiglu)")
        self.attention_norm = RMSNorm(cfg["width"], cfg["norm_eps"])
        self.attention = Attention(cfg, layer)
        self.mlp_norm = RMSNorm(cfg["width"], cfg["norm_eps"])
        self.mlp = MLP(cfg["width"], mlp_hidden(cfg), cfg["mlp"] == "swiglu")

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.mlp(self.mlp_norm(h))


def lm_logits(model, tokens):
    """Logits [B, T, vocab] of a module with TransformerLM's embedding, blocks and
    final_norm; the output head is the embedding (tied weights)."""
    h = model.embedding(tokens)
    for block in model.blocks:
        h = block(h)
    return torch.matmul(model.final_norm(h), model.embedding.weight.t())


_MASK64 = (1 << 64) - 1


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def parameter_seed(seed, name):
    """The seed of the generator that initialises parameter `name` (cqk::parameter_seed)."""
    h = 0xCBF29CE484222325  # FNV-1a over the name's bytes
    for byte in name.encode():
        h = ((h ^ byte) * 0x100000001B3) & _MASK64
    return _splitmix64(_splitmix64(seed & _MASK64) ^ h)


def _draw(name, p, cfg, generator):
    """Draws `p` from its initial distribution; False for a parameter with a fixed initial value."""
    std = cfg["init_std"]
    # Projections that write into the residual stream are scaled down by sqrt(2 * layers) (GPT-2).
    residual_std = std / math.sqrt(2.0 * cfg["layers"])
    if name == "embedding.weight":
        p.normal_(0.0, std, generator=generator)
    elif ".coupling." in name:
        if not name.endswith(".w1"):
            return False  # the conditioners' output layers and biases start at zero
        bound = 1.0 / math.sqrt(p.shape[-1])
        p.uniform_(-bound, bound, generator=generator)
    elif "_proj.weight" in name or "mlp." in name:
        residual = "out_proj." in name or "mlp.down." in name
        p.normal_(0.0, residual_std if residual else std, generator=generator)
    elif ".lambda_" in name:
        p.normal_(0.0, 0.1, generator=generator)
    else:
        return False
    return True


class TransformerLM(nn.Module):
    def __init__(self, cfg, init_seed=None):
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg["vocab_size"], cfg["width"])
        self.blocks = nn.ModuleList([Block(cfg, layer) for layer in range(cfg["layers"])])
        self.final_norm = RMSNorm(cfg["width"], cfg["norm_eps"])
        self.initialise(torch.initial_seed() if init_seed is None else init_seed)

    @torch.no_grad()
    def initialise(self, seed):
        for name, p in self.named_parameters():
            if p.is_meta:
                continue  # built without storage (transformers' from_pretrained): the weights are loaded next
            # Drawn on the CPU, as cqk does, so the values do not depend on the device.
            values = p.detach().to("cpu", torch.float32).clone()
            if _draw(name, values, self.cfg, torch.Generator().manual_seed(parameter_seed(seed, name))):
                p.copy_(values)

    def forward(self, tokens):
        return lm_logits(self, tokens)

    def loss(self, tokens, targets):
        logits = self.forward(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-100)

    def flops_per_token(self, seq_len):
        params = sum(p.numel() for p in self.parameters())
        return 6.0 * params + 12.0 * self.cfg["layers"] * self.cfg["width"] * seq_len
