"""The achieved bandwidth of memory-bound kernels, from Liger-Kernel's published benchmark data.

Liger-Kernel (github linkedin/Liger-Kernel) publishes the median time of its benchmark ops per
provider (`huggingface`/`torch`: the eager module; `torchcompile`; `liger`: its Triton kernels;
`megatron`) on named GPUs in benchmark/data/*.csv. For each row this script runs the same op at the
same shape (the benchmark script's own module, copied below with its source) under ckplan's fake
profiler (planner/profiler/fake.py OpBytes: the bytes every memory-bound op reads and writes, the
count ckplan charges) and prints the bytes, the ops, and the rate the published time implies. For a
fused provider (torchcompile, liger, megatron's fused kernel) the bytes are the op's own inputs and
outputs, each once (what ckplan charges a fused kernel: compiled_time.py's once-per-buffer count).

Per (kernel, provider, mode, GPU) sweep it also prints the rate between the two largest sizes
(delta bytes / delta time: any fixed cost per call cancels) and the fixed part that leaves at the
largest (time - bytes / that rate), per eager op; then per architecture the harmonic means ckplan
reads: eager, fused, and eager per op class (planner/profiler/membound.py OP_CLASSES; CLASS_OF).

    PYTHONPATH=$PWD python scripts/membound_rates.py [--eager-only] NAME=FILE.csv ...

--eager-only skips the fused providers (no compiles: a minute instead of fifteen).

NAME is a label for the file (its repository commit); the CSVs are read with `git show
COMMIT:benchmark/data/FILE` from a clone of Liger-Kernel.
"""

from __future__ import annotations

import csv
import json
import sys

import torch
import torch.nn.functional as F
from torch import nn

from planner.profiler.fake import OpBytes, new_mode

EAGER = {"huggingface", "torch", "megatron-unfused"}
FUSED = {"liger", "torchcompile", "megatron", "megatron-fused"}
# providers that are torch.compile: torchcompile; Megatron's bias_swiglu_impl (jit_fuser = torch.compile on
# torch >= 2.2, megatron/core/jit.py); their bytes are inductor's count of the compiled op
COMPILED = {"torchcompile": {"rms_norm", "layer_norm", "rope", "cross_entropy"}}
# torch.nn.RMSNorm on CUDA is one fused kernel (aten._fused_rms_norm), not the eager chain the CPU
# decomposition runs: timed as fused
NOT_EAGER = {("megatron_rms_norm", "torch"), ("megatron_cross_entropy", "megatron-unfused")}


# the op class (membound.OP_CLASSES) each eager benchmark op measures
CLASS_OF = {"rms_norm": "norm", "layer_norm": "layer_norm", "rope": "attention", "megatron_swiglu": "activation",
            "cross_entropy": "loss", "relu_squared": "elementwise", "fused_add_rms_norm": "norm", "dyt": "elementwise"}
# read for their class only: the eager mean (what bytes no class claims read) stays over the op chains
ONLY_CLASSED = {"relu_squared", "dyt"}


class LlamaRMSNorm(nn.Module):
    """Liger-Kernel benchmark/scripts/benchmark_rms_norm.py (3534d44), as published: the weight is
    fp32 (nn.Parameter(torch.ones(h)), never cast), so the output is fp32."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """transformers' LLaMA apply_rotary_pos_emb (modeling_llama.py), which Liger's rope benchmark times."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


class Counted(OpBytes):
    """OpBytes that also counts the memory-bound ops (each one eager kernel)."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = self.bytes
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self.ops += self.bytes > before
        return out


def _setup_model_sweep(kernel: str, x: int, config: dict, dtype):
    """Liger's later benchmarks (benchmark/scripts at 7a12e092, all_benchmark_data_cutile.csv's B200
    rows): a model's widths in the config, x the tokens; their `full` mode backpropagates the first
    output only (utils.run_speed_benchmark)."""
    if kernel == "rope":  # q and k as (1, T, heads, head_dim).transpose(1, 2); fwd_fn()[0]: q_embed
        head_dim = config["hidden_size"] // config["num_attention_heads"]
        q = torch.randn(1, x, config["num_attention_heads"], head_dim, dtype=dtype).transpose(1, 2).requires_grad_()
        k = torch.randn(1, x, config["num_key_value_heads"], head_dim, dtype=dtype).transpose(1, 2).requires_grad_()
        cos, sin = torch.randn(1, x, head_dim, dtype=dtype), torch.randn(1, x, head_dim, dtype=dtype)
        return lambda: apply_rotary_pos_emb(q, k, cos, sin)[0], [q, k, cos, sin]
    if kernel == "layer_norm":  # torch.nn.LayerNorm(hidden).to(dtype) over (T, hidden)
        module = nn.LayerNorm(config["hidden_size"], eps=config["eps"], dtype=dtype)
        inp = torch.randn(x, config["hidden_size"], dtype=dtype, requires_grad=True)
        return lambda: module(inp), [inp, module.weight, module.bias]
    if kernel == "cross_entropy":  # fp32 logits (BT, V), nn.CrossEntropyLoss
        logits = torch.randn(x, config["vocab_size"], requires_grad=True)
        target = torch.randint(config["vocab_size"], (x,))
        return lambda: F.cross_entropy(logits, target), [logits, target]
    if kernel == "fused_add_rms_norm":  # NaiveAddRMSNorm: fp32 add, then HF's RMSNorm chain; [0]: the norm
        weight = nn.Parameter(torch.ones(config["hidden_size"]))
        inp = torch.randn(x, config["hidden_size"], dtype=dtype, requires_grad=True)
        residual = torch.randn(x, config["hidden_size"], dtype=dtype, requires_grad=True)

        def fwd():
            hidden = inp.to(torch.float32) + residual.to(torch.float32)
            variance = hidden.pow(2).mean(-1, keepdim=True)
            hidden = hidden * torch.rsqrt(variance + config["eps"])
            return weight * hidden.to(dtype)

        return fwd, [inp, residual, weight]
    if kernel == "dyt":  # TorchDyT (test/transformers/test_dyt.py): gamma * tanh(x * alpha) [+ beta], fp32 params
        alpha = nn.Parameter(torch.ones(1) * 0.5)
        gamma = nn.Parameter(torch.ones(config["hidden_size"]))
        beta = nn.Parameter(torch.zeros(config["hidden_size"])) if config["beta"] else None
        inp = torch.randn(x, config["hidden_size"], dtype=dtype, requires_grad=True)
        if beta is None:
            return lambda: gamma * torch.tanh(inp * alpha), [inp, alpha, gamma]
        return lambda: gamma * torch.tanh(inp * alpha) + beta, [inp, alpha, gamma, beta]
    return None


def _setup(kernel: str, x: int, config: dict):
    """(the forward callable, its differentiable inputs) at the row's shape, fake."""
    dtype = getattr(torch, str(config.get("dtype", "torch.bfloat16")).removeprefix("torch."))
    if any(key in config for key in ("num_attention_heads", "vocab_size")) or ("hidden_size" in config and kernel != "rope"):
        return _setup_model_sweep(kernel, x, config, dtype)
    if kernel == "rms_norm":
        module = LlamaRMSNorm(x)
        inp = torch.randn(config["M"], x, dtype=dtype, requires_grad=True)
        return lambda: module(inp), [inp, module.weight]
    if kernel == "layer_norm":
        module = nn.LayerNorm(x, eps=config["eps"])
        inp = torch.randn(config["M"], x, dtype=dtype, requires_grad=True)
        return lambda: module(inp), [inp, module.weight, module.bias]
    if kernel == "megatron_rms_norm":  # torch.nn.RMSNorm in bf16 (benchmark_megatron_rms_norm.py)
        module = nn.RMSNorm(x, eps=1e-6, dtype=torch.bfloat16)
        inp = torch.randn(config["S"], config["B"], x, dtype=torch.bfloat16, requires_grad=True)
        return lambda: module(inp), [inp, module.weight]
    if kernel == "rope":
        hidden = config.get("hidden_size", x)
        seq = config.get("seq_len", x)
        head_dim = hidden // config["num_q_heads"]
        q = torch.randn(1, seq, config["num_q_heads"], head_dim, dtype=dtype).transpose(1, 2).requires_grad_()
        k = torch.randn(1, seq, config["num_kv_heads"], head_dim, dtype=dtype).transpose(1, 2).requires_grad_()
        cos = torch.randn(1, seq, head_dim, dtype=dtype)
        sin = torch.randn(1, seq, head_dim, dtype=dtype)
        return lambda: apply_rotary_pos_emb(q, k, cos, sin), [q, k, cos, sin]
    if kernel == "relu_squared":  # TorchReLUSquared: relu then torch.square (benchmark_relu_squared.py, ace042ec)
        inp = torch.randn(config["M"], x, dtype=dtype, requires_grad=True)
        return lambda: torch.square(F.relu(inp)), [inp]
    if kernel == "megatron_swiglu":  # F.silu(y1) * y2 over torch.chunk(y, 2, -1), bf16
        y = torch.randn(config["S"], config["B"], 2 * x, dtype=torch.bfloat16, requires_grad=True)
        return lambda: (lambda a, b: F.silu(a) * b)(*torch.chunk(y, 2, -1)), [y]
    if kernel == "cross_entropy":  # fp32 logits (torch.randn's default), nn.CrossEntropyLoss
        logits = torch.randn(config["B"] * config["T"], x, requires_grad=True)
        target = torch.randint(x, (config["B"] * config["T"],))
        return lambda: F.cross_entropy(logits, target), [logits, target]
    if kernel == "megatron_cross_entropy":  # bf16 logits (S, B, V), TP 1
        logits = torch.randn(config["S"], config["B"], x, dtype=torch.bfloat16, requires_grad=True)
        target = torch.randint(x, (config["S"], config["B"]))
        return (lambda: F.cross_entropy(logits.view(-1, x).float(), target.view(-1), reduction="none")), \
            [logits, target]
    return None


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def count(kernel: str, x: int, config: dict, mode: str) -> tuple[int, int, int] | None:
    """(eager bytes, eager ops, fused bytes) of the benchmark op's forward, backward or both."""
    with new_mode():
        made = _setup(kernel, x, config)
        if made is None:
            return None
        fwd, inputs = made
        counted = Counted()
        if mode in ("forward", "full"):
            with counted:
                out = fwd()
        else:
            out = fwd()
        outs = out if isinstance(out, tuple) else (out,)
        fused = _nbytes(inputs) + _nbytes(outs) if mode in ("forward", "full") else 0
        if mode in ("backward", "full"):
            grads = [torch.randn_like(o) for o in outs]
            with counted:
                torch.autograd.backward(outs, grads)
            wants = [t for t in inputs if t.requires_grad]
            fused += _nbytes(grads) + _nbytes(inputs) + _nbytes(wants)
        return counted.bytes, counted.ops, fused


# the dimension each benchmark op's bytes grow with linearly (rows): inductor's count is taken at
# 8 and 16 rows on CPU (real tensors) and extended to the row's size
_ROWS = {"rms_norm": "M", "layer_norm": "M", "relu_squared": "M", "megatron_rms_norm": "S", "megatron_swiglu": "S", "cross_entropy": "T",
         "megatron_cross_entropy": "S"}
_compiled: dict[tuple, tuple[int, int]] = {}


def compiled_count(kernel: str, x: int, config: dict, x_name: str) -> tuple[int, int]:
    """(forward, backward) bytes of inductor's kernels for the op compiled (CPU backend; the
    once-per-buffer count planner/profiler/compiled_time.py charges), at the row's shape."""
    from planner.profiler.compiled_time import inductor_kernels, memory_bound_bytes

    key = (kernel, x, json.dumps(config, sort_keys=True))
    if key in _compiled:
        return _compiled[key]
    rows_key = "seq_len" if kernel == "rope" and x_name == "H" else "x" if kernel == "rope" else _ROWS[kernel]
    full_rows = x if rows_key == "x" else config[rows_key]
    counts = []
    for rows in (8, 16):
        small = dict(config, **({} if rows_key == "x" else {rows_key: rows}))
        fwd, inputs = _setup(kernel, rows if rows_key == "x" else x, small)
        with inductor_kernels() as graphs:
            torch._dynamo.reset()
            out = torch.compile(fwd, backend="inductor", fullgraph=True)()
            outs = out if isinstance(out, tuple) else (out,)
            torch.autograd.backward(outs, [torch.randn_like(o) for o in outs])
        counts.append([memory_bound_bytes(graph) for graph in graphs])
    (f1, b1), (f2, b2) = counts
    scale = (full_rows - 8) / 8
    _compiled[key] = (round(f1 + (f2 - f1) * scale), round(b1 + (b2 - b1) * scale))
    return _compiled[key]


# datasheet HBM bandwidth, TB/s, of each gpu_name in the data (NVIDIA H100 datasheet: SXM 3.35, NVL 3.9;
# A100 datasheet: 80 GB SXM 2.039, 80 GB PCIe 1.935), and the architecture ckplan's GPU records share
DATASHEET_TBPS = {"NVIDIA H100 NVL": (3.9, "H100"), "NVIDIA H100 80GB HBM3": (3.35, "H100"),
                  "NVIDIA A100-SXM4-80GB": (2.039, "A100"), "NVIDIA A100 80GB PCIe": (1.935, "A100"),
                  "NVIDIA B200": (8.0, "B200"),  # HGX B200 datasheet: 8 TB/s
                  "AMD Instinct MI300X": (5.3, "MI300X")}  # AMD Instinct MI300X data sheet: 5.3 TB/s


def summary(fractions: dict[tuple[str, str], list[tuple[str, float]]]) -> None:
    """Per architecture and kind (eager, compiled, fused, and eager/CLASS): each sweep's forward+backward
    rate as a fraction of its GPU's datasheet, and their harmonic mean (the rate at which equal bytes of
    each op would run)."""
    print("\n| architecture | kind | sweeps (fraction of the datasheet) | harmonic mean |\n|---|---|---|---|")
    for (arch, kind), found in sorted(fractions.items()):
        mean = len(found) / sum(1 / fraction for _, fraction in found)
        listed = ", ".join(f"{name} {fraction:.3f}" for name, fraction in found)
        print(f"| {arch} | {kind} | {listed} | {mean:.3f} |")


def rows(files: list[tuple[str, str]]):
    for name, path in files:
        with open(path) as handle:
            for line, row in enumerate(csv.DictReader(handle), start=2):
                if row["metric_name"] == "speed":
                    yield name, line, row


def main(argv: list[str]) -> None:
    eager_only = "--eager-only" in argv
    files = [tuple(arg.split("=", 1)) for arg in argv if arg != "--eager-only"]
    sweeps: dict[tuple, list] = {}
    for name, line, row in rows(files):
        config = json.loads(row["extra_benchmark_config_str"])
        if config.get("TP", 1) != 1:
            continue
        provider, mode = row["kernel_provider"], row["kernel_operation_mode"]
        if not row["x_value"].isdigit() or mode not in ("forward", "backward", "full"):
            continue  # a sweep over named model configs; a no-grad forward
        if provider not in EAGER | FUSED or (eager_only and provider not in EAGER):
            continue
        found = count(row["kernel_name"], int(row["x_value"]), config, mode)
        if found is None:
            continue
        eager_bytes, ops, fused_bytes = found
        eager = provider in EAGER and (row["kernel_name"], provider) not in NOT_EAGER
        if provider == "megatron-unfused":
            continue  # Megatron's own unfused vocab-parallel chain, not the op counted here
        counted = eager_bytes if eager else fused_bytes
        if provider in COMPILED and row["kernel_name"] in COMPILED[provider]:
            counted = None  # inductor's count, taken below at the two largest sizes only (a compile each)
        key = (row["kernel_name"], provider, mode, row["gpu_name"], row["x_name"], json.dumps(config, sort_keys=True),
               name)
        sweeps.setdefault(key, []).append((int(row["x_value"]), float(row["y_value_50"]), counted, ops if eager else 0,
                                           name, line))
    print("| kernel | provider | mode | GPU | sweep | largest: MB, eager ops, ms, TB/s | rate between the two "
          "largest, TB/s | fixed part at the largest, µs (per eager op) | source (file:line of the largest) |")
    print("|---|---|---|---|---|---|---|---|---|")
    fractions: dict[tuple[str, str], list[tuple[str, float]]] = {}
    for key, points in sweeps.items():
        kernel, provider, mode, gpu, x_name, config, _ = key
        points.sort()
        for i in (-2, -1):
            x, ms, counted, ops, name, line = points[i]
            if counted is None:
                fwd_bytes, bwd_bytes = compiled_count(kernel, x, json.loads(config), x_name)
                points[i] = (x, ms, {"forward": fwd_bytes, "backward": bwd_bytes, "full": fwd_bytes + bwd_bytes}[mode],
                             ops, name, line)
        (_, t1, b1, _, _, _), (x2, t2, b2, ops, name, line) = points[-2], points[-1]
        slope = (b2 - b1) / (t2 - t1) / 1e9 if t2 > t1 else float("nan")
        fixed_us = (t2 - b2 / (slope * 1e9)) * 1e3 if slope == slope and slope else float("nan")
        per_op = f" ({fixed_us / ops:.1f})" if ops else ""
        datasheet = DATASHEET_TBPS.get(gpu)
        if mode == "full" and datasheet and slope == slope and 0 < slope:
            kind = "eager" if ops else "compiled" if provider in COMPILED else "fused"
            if kernel not in ("rope",) or x_name == "T":  # rope: the sweep over tokens (the larger)
                label = f"{kernel}/{provider}/{gpu.removeprefix('NVIDIA ')}"
                if kernel not in ONLY_CLASSED:
                    fractions.setdefault((datasheet[1], kind), []).append((label, slope / datasheet[0]))
                if kind == "eager" and kernel in CLASS_OF:
                    fractions.setdefault((datasheet[1], f"eager/{CLASS_OF[kernel]}"), []).append(
                        (label, slope / datasheet[0]))
        print(f"| {kernel} | {provider} | {mode} | {gpu.removeprefix('NVIDIA ')} | {x_name} {points[0][0]}-{x2} "
              f"{config} | {b2 / 1e6:.0f}, {ops or '-'}, {t2:.3f}, {b2 / t2 / 1e9:.2f} | "
              f"{slope:.2f} | {fixed_us:.0f}{per_op} | {name}:{line} |")
    summary(fractions)


if __name__ == "__main__":
    main(sys.argv[1:])
