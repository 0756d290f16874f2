"""Synthetic profiles for tests and benchmarks: shaped like real ones, no model needed."""

from __future__ import annotations

import random

from planner.schema import DeviceInfo, FileRef, LayerProfile, Profile

MIB = 2**20


def layer(name: str, kind: str, *, fwd_ms: float, act_mib: float, input_mib: float, param_count: int,
          bwd_ratio: float = 2.0, transient_mib: float = 0.0, output_mib: float | None = None,
          adam_step_ms: float = 0.0, recompute_ms: float | None = None,
          largest_param_count: int | None = None) -> LayerProfile:
    """`adam_step_ms`: the layer's optimizer step (SGD's taken as a third of Adam's); 0: none
    measured. `recompute_ms`: what checkpointing adds; None: not measured (a whole forward)."""
    act_bytes, input_bytes = int(act_mib * MIB), int(input_mib * MIB)
    return LayerProfile(
        name=name, kind=kind, fwd_ms=fwd_ms, bwd_ms=fwd_ms * bwd_ratio,
        fwd_ms_min=fwd_ms, fwd_ms_max=fwd_ms, bwd_ms_min=fwd_ms * bwd_ratio, bwd_ms_max=fwd_ms * bwd_ratio,
        act_bytes=act_bytes, input_bytes=input_bytes,
        output_bytes=int((input_mib if output_mib is None else output_mib) * MIB),
        input_in_act_bytes=min(input_bytes, act_bytes), param_count=param_count, param_bytes=4 * param_count,
        transient_bytes=int(transient_mib * MIB),
        step_ms={"adam": adam_step_ms, "sgd": adam_step_ms / 3} if adam_step_ms else {},
        recompute_ms=recompute_ms, largest_param_count=largest_param_count,
    )


def profile_of(layers: list[LayerProfile], *, name: str = "synthetic", micro_batch_size: int = 1) -> Profile:
    return Profile(
        name=name, created_at="1970-01-01T00:00:00Z", torch_version="synthetic",
        device=DeviceInfo(type="cpu", name="synthetic", threads=1), dtype="float32",
        micro_batch_size=micro_batch_size, model=FileRef(file=f"{name}.py", sha256="0" * 64), layers=layers,
    )


def uniform_blocks(num_blocks: int, *, seed: int = 0, noise: float = 0.03) -> Profile:
    """Embedding + identical transformer-like blocks + LM head; block times carry
    measurement-like noise (the blocks stay one kind, as the profiler would mark them)."""
    rng = random.Random(seed)
    layers = [layer("embed", "Embedding", fwd_ms=0.5, act_mib=0.1, input_mib=0.01, output_mib=8, param_count=50_000_000)]
    for i in range(num_blocks):
        jitter = 1 + rng.uniform(-noise, noise)
        layers.append(layer(f"blocks.{i}", "Block", fwd_ms=10 * jitter, act_mib=136, input_mib=8,
                            param_count=12_600_000, transient_mib=24))
    layers.append(layer("head", "Head", fwd_ms=12, act_mib=40, input_mib=8, output_mib=100,
                        param_count=50_000_000, transient_mib=100))
    return profile_of(layers, name=f"uniform{num_blocks}")


def heterogeneous(num_layers: int, *, seed: int = 0, spread: float = 0.3) -> Profile:
    """Every layer different (times, activations, parameters by up to ±spread): each its own kind."""
    rng = random.Random(seed)
    vary = lambda base: base * (1 + rng.uniform(-spread, spread))  # noqa: E731
    layers = [
        layer(f"layers.{i}", f"L{i}", fwd_ms=vary(10), act_mib=vary(136), input_mib=vary(8),
              param_count=int(vary(12_600_000)), transient_mib=vary(24))
        for i in range(num_layers)
    ]
    return profile_of(layers, name=f"hetero{num_layers}")
