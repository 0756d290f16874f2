"""The measurement that would settle a Transformer Engine block's host time (docs/published-runs.md §35.tehost): each
TE module of Megatron-core's TE-spec dense block, forward and backward, timed on a CUDA host while the device is
held behind (so the host never waits), against its stand-in in scripts/bench_host.py's replica (a torch Linear, or
SDPA for the attention), both in units of one torch Linear forward at TransformerEngine#2053's setting (BF16, 2048 x
2048 weight, 8192 tokens: 13.48 µs on a DGX H100's Xeon 8480C). What it prints is what the Megatron record's
`host_block_linears` would add a block: each module's excess over its stand-in, forward and backward.

Why a probe and not a term: no published figure gives a TE module's host time at the G rows' TE (v2.16, f8a01cd5)
on any host. TE#2053 (2025-08, an older TE) published TE Linear's forward only on Grace (99.66 µs GB200, 90.53 GH200,
against torch's 37.08, 33.17), and TE#2126's maintainer reads the BF16 TE Linear as "nearly the same with vanilla
torch linear" after TE's CPU-overhead PRs (#2377, #2400, #2559, #2957, all before v2.16): the replica's reading.

The modules, at one rank's shard of the row's shapes (the tensor-parallel collectives are not run: tp_size 1 with
the sharded widths; their issue is hostcalls.py's): linear_qkv (LayerNormLinear, hidden -> 3 hidden / TP), the
core attention (DotProductAttention, sbhd, causal; --attention unfused forces NVTE_FUSED_ATTN=0 and
NVTE_FLASH_ATTN=0), linear_proj (Linear, hidden / TP -> hidden), linear_fc1 (LayerNormLinear, hidden -> ffn / TP),
linear_fc2 (Linear, ffn / TP -> hidden), each with a bias (GPT) and Megatron's return_bias where it uses it.

With --megatron, Megatron-core's own TE-spec TransformerLayer whole (gpt_layer_specs.py
get_gpt_layer_with_transformer_engine_spec; one process, TP 1 at the rank's shard widths), forward and backward,
against the Megatron record's `host_block_linears` for the attention kind: the measured block in place of the replica.

Skips cleanly (one line, exit 0) without CUDA or Transformer Engine (or, with --megatron, megatron.core). Run on an idle DGX H100 (one process, one GPU):
    PYTHONPATH=$PWD python scripts/te_host_probe.py --hidden 512 --heads 8 --seq 1024 --micro-batch 4 --tp 4 \
        --attention unfused                     # row G8; --tp 1 --attention fused for G1/G2; add --fp8 for G10
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

UNIT_SHAPE = (8192, 2048, 2048)  # TransformerEngine#2053's Linear: tokens, in, out (BF16)
# the replica's stand-ins in torch Linear forwards (docs/published-runs.md §23.hostcall, scripts/bench_host.py):
# a torch Linear's forward and backward, SDPA's core attention, TE's UnfusedDotProductAttention replicated in torch
STAND_IN = {"linear": (1.00, 4.26), "flash": (2.73, 6.96), "unfused": (8.93, 12.95)}
MODULES = ("linear_qkv", "core_attention", "linear_proj", "linear_fc1", "linear_fc2")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--ffn", type=int, default=None, help="default 4 x hidden")
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--attention", choices=("fused", "unfused"), default="fused")
    parser.add_argument(
        "--fp8", action="store_true", help="under TE's autocast with Float8CurrentScaling (row G10)"
    )
    parser.add_argument(
        "--calls", type=int, default=40, help="calls a repeat (kept under the launch queue's depth)"
    )
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument(
        "--megatron",
        action="store_true",
        help="also time Megatron-core's TE-spec TransformerLayer whole",
    )
    args = parser.parse_args(argv)
    args.ffn = args.ffn or 4 * args.hidden
    for name in ("hidden", "heads", "ffn", "seq", "micro_batch", "tp", "calls", "repeats"):
        if getattr(args, name) < 1:
            parser.error(
                f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}"
            )
    if args.megatron and args.fp8:
        parser.error(
            "--megatron times the layer in BF16 only; run --fp8 without it (the modules under FP8)"
        )
    if args.heads % args.tp or args.ffn % args.tp or args.hidden % args.heads:
        parser.error(
            f"--tp {args.tp} must divide --heads {args.heads} and --ffn {args.ffn}, and --heads the hidden size"
        )
    return args


def excess(
    te_units: dict[str, tuple[float, float]], attention: str
) -> dict[str, tuple[float, float]]:
    """Each module's host time beyond its stand-in in the replica, (forward, backward) in torch Linear forwards."""
    out = {}
    for name, (fwd, bwd) in te_units.items():
        base = STAND_IN[
            ("flash" if attention == "fused" else "unfused")
            if name == "core_attention"
            else "linear"
        ]
        out[name] = (fwd - base[0], bwd - base[1])
    return out


def unavailable(megatron: bool = False) -> str | None:
    """Why the probe cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (the probe times the host while a GPU runs behind it)"
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception as exc:  # an import error or TE's own load failure: either way nothing to time
        return f"Transformer Engine does not import ({type(exc).__name__}: {exc})"
    if megatron:
        try:
            import megatron.core  # noqa: F401
        except Exception as exc:
            return f"megatron.core does not import ({type(exc).__name__}: {exc})"
    return None


def _hold_device(seconds: float) -> None:
    """Queue a sleep kernel so the device runs behind the host for `seconds` (the host then never waits)."""
    import torch

    # cycles at up to 2 GHz: at least `seconds` on any current GPU
    torch.cuda._sleep(int(seconds * 2.0e9))


def _time_host(issue, calls: int, repeats: int) -> float:
    """Median over repeats of the host's time a call (µs) to issue `issue()`, the device held behind."""
    import torch

    medians = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        _hold_device(0.05 + calls * 1e-3)
        t0 = time.perf_counter()
        for _ in range(calls):
            issue()
        medians.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(medians)


def _fwd_bwd_us(module, inputs, calls: int, repeats: int, ctx) -> tuple[float, float]:
    """A module's forward's and backward's host µs a call: forwards timed, then backwards over kept graphs."""
    import torch

    def forward():
        with ctx():
            out = module(*inputs)
        return out[0] if isinstance(out, tuple) else out

    fwd = _time_host(forward, calls, repeats)
    backs = []
    for _ in range(repeats):
        outs = [forward() for _ in range(calls)]
        grad = torch.ones_like(outs[0])
        torch.cuda.synchronize()
        _hold_device(0.05 + calls * 2e-3)
        t0 = time.perf_counter()
        for out in outs:
            out.backward(grad)
        backs.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return fwd, statistics.median(backs)


def run(args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """Host µs (forward, backward) of the unit Linear and each TE module."""
    import contextlib

    import torch
    import transformer_engine.pytorch as te

    dev, dtype = torch.device("cuda"), torch.bfloat16
    ctx = contextlib.nullcontext
    if args.fp8:
        from transformer_engine.common.recipe import Float8CurrentScaling

        autocast = getattr(te, "autocast", None) or te.fp8_autocast
        ctx = lambda: autocast(enabled=True, recipe=Float8CurrentScaling())  # noqa: E731
    tokens, h, tp = args.seq * args.micro_batch, args.hidden, args.tp
    head_dim = h // args.heads
    x = lambda rows, cols: torch.randn(rows, cols, device=dev, dtype=dtype, requires_grad=True)  # noqa: E731
    tokens_in = x(tokens, h)
    qkv = [
        torch.randn(
            args.seq,
            args.micro_batch,
            args.heads // tp,
            head_dim,
            device=dev,
            dtype=dtype,
            requires_grad=True,
        )
        for _ in range(3)
    ]
    n, k, m = UNIT_SHAPE
    unit = torch.nn.Linear(k, m, device=dev, dtype=dtype)
    found = {
        "unit": _fwd_bwd_us(unit, (x(n, k),), args.calls, args.repeats, contextlib.nullcontext)
    }
    lnl = dict(params_dtype=dtype, device=dev, bias=True)
    modules = {
        "linear_qkv": (te.LayerNormLinear(h, 3 * h // tp, **lnl), (tokens_in,)),
        "core_attention": (
            te.DotProductAttention(
                args.heads // tp, head_dim, attn_mask_type="causal", qkv_format="sbhd"
            ).to(dtype),
            tuple(qkv),
        ),
        "linear_proj": (te.Linear(h // tp, h, return_bias=True, **lnl), (x(tokens, h // tp),)),
        "linear_fc1": (
            te.LayerNormLinear(h, args.ffn // tp, return_bias=True, **lnl),
            (tokens_in,),
        ),
        "linear_fc2": (
            te.Linear(args.ffn // tp, h, return_bias=True, **lnl),
            (x(tokens, args.ffn // tp),),
        ),
    }
    for name in MODULES:
        module, inputs = modules[name]
        found[name] = _fwd_bwd_us(module, inputs, args.calls, args.repeats, ctx)
    return found


def run_block(args: argparse.Namespace) -> tuple[float, float]:
    """Host µs (forward, backward) of one Megatron-core TE-spec TransformerLayer at the rank's shard widths, in one
    process (world 1, TP 1): the TP collectives are not issued (hostcalls.py's)."""
    import contextlib

    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.enums import AttnBackend
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import TransformerLayer

    if not dist.is_initialized():
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29517", world_size=1, rank=0)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)
    h, tp = args.hidden, args.tp
    config = TransformerConfig(
        num_layers=1,
        hidden_size=h,
        ffn_hidden_size=args.ffn // tp,
        num_attention_heads=args.heads // tp,
        kv_channels=h // args.heads,
        hidden_dropout=0.1,
        attention_dropout=0.1,
        add_bias_linear=True,
        bias_dropout_fusion=True,
        bias_activation_fusion=True,
        bf16=True,
        params_dtype=torch.bfloat16,
        attention_backend=AttnBackend.unfused if args.attention == "unfused" else AttnBackend.fused,
    )
    spec = get_gpt_layer_with_transformer_engine_spec()
    layer = TransformerLayer(config, spec.submodules, layer_number=1).cuda()
    x = torch.randn(
        args.seq, args.micro_batch, h, device="cuda", dtype=torch.bfloat16, requires_grad=True
    )
    return _fwd_bwd_us(
        lambda t: layer(hidden_states=t, attention_mask=None),
        (x,),
        args.calls,
        args.repeats,
        contextlib.nullcontext,
    )


def block_report(unit_us: float, block: tuple[float, float], attention: str) -> list[str]:
    """The whole layer in torch Linear forwards beside the Megatron record's block for the attention kind."""
    from planner.cost.runtime_megatron import HOST_BLOCK_LINEARS

    record = {name: (fwd, bwd) for name, fwd, bwd in HOST_BLOCK_LINEARS}[
        "flash" if attention == "fused" else "eager"
    ]
    fwd, bwd = block[0] / unit_us, block[1] / unit_us
    return [
        f"Megatron-core TransformerLayer (TE spec): forward {block[0]:.2f} µs = {fwd:.2f} units, backward "
        f"{block[1]:.2f} µs = {bwd:.2f} units; the record's block {record[0]:.2f} / {record[1]:.2f}: "
        f"{fwd - record[0]:+.2f} / {bwd - record[1]:+.2f} units"
    ]


def report(found: dict[str, tuple[float, float]], attention: str) -> list[str]:
    """The table: µs, torch Linear forwards, and the excess over the replica's stand-in, with the block's sum."""
    unit = found["unit"][0]
    units = {name: (fwd / unit, bwd / unit) for name, (fwd, bwd) in found.items() if name != "unit"}
    extra = excess(units, attention)
    lines = [
        f"unit: torch Linear {UNIT_SHAPE[1]}x{UNIT_SHAPE[2]} on {UNIT_SHAPE[0]} tokens, forward "
        f"{unit:.2f} µs, backward {found['unit'][1]:.2f} µs (TransformerEngine#2053: 13.48 µs forward on DGX H100)",
        "| module | fwd µs | bwd µs | fwd / unit | bwd / unit | beyond stand-in fwd | beyond stand-in bwd |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in MODULES:
        (fwd, bwd), (uf, ub), (ef, eb) = found[name], units[name], extra[name]
        lines.append(
            f"| {name} | {fwd:.2f} | {bwd:.2f} | {uf:.2f} | {ub:.2f} | {ef:+.2f} | {eb:+.2f} |"
        )
    sf, sb = sum(e[0] for e in extra.values()), sum(e[1] for e in extra.values())
    lines.append(f"| block (five modules) | | | | | {sf:+.2f} | {sb:+.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # before TE's import: its attention utils.py reads NVTE_FLASH_ATTN once, at import (line 66)
    if args.attention == "unfused":
        os.environ["NVTE_FUSED_ATTN"], os.environ["NVTE_FLASH_ATTN"] = "0", "0"
    reason = unavailable(args.megatron)
    if reason:
        print(f"te_host_probe: skipped: {reason}")
        return 0
    found = run(args)
    print("\n".join(report(found, args.attention)))
    if args.megatron:
        print("\n".join(block_report(found["unit"][0], run_block(args), args.attention)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
