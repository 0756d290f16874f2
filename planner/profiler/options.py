"""Each layer's recompute options (planner/runtime/recompute.py), measured as none and full are.

Per option, with the profiler's own machinery:

- kept bytes: the saved-tensor hooks of saved.py over the whole chain (each storage once,
  none of what earlier layers keep), plus the outputs a selective policy saves;
- recompute_ms: medians of (option forward + backward) minus (plain forward + backward),
  at least 0, from a job that times the plain layer and its options in turn (OPTION_REPEATS);
- recompute_peak_bytes: the option's transient (the tracker of measure._transient_bytes:
  peak beyond what it keeps, in forward or backward) beyond the layer's plain transient;
- offload's host_bytes: what none keeps less what offload keeps on the device (the hooks
  see the tensors it leaves there); its recompute_ms is the copies' time, timed as above.
  On cpu it moves nothing (the host is the device), keeps what none keeps and is left out.

An option that raises (an in-place op on a tensor a selective policy saved, say) is left out
and said. Layers of one kind list the same options: those every layer of the kind runs and
that keep fewer bytes than none on every one of them (one that keeps no fewer never helps).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from planner.profiler.splitbackward import recorded_split_ms
from planner.profiler.timing import FwdBwdJob
from planner.runtime.recompute import find_options, layer_runner
from planner.schema import OPTION_FULL, OPTION_NONE, OPTION_OFFLOAD, RecomputeOption


def option_repeats(repeats: int) -> int:
    """Timed steps per option: half the layer's (rounded up). Ten options per layer timed as
    often as the layer itself would make profiling several times longer; an option's time is a
    difference of medians that only the solver's choice between options reads."""
    return max(1, (repeats + 1) // 2)


def runnable_options(layer: nn.Module, device_type: str) -> list[str]:
    """The options besides none and full worth measuring on this device: all the layer has
    (recompute.find_options), less offload on cpu, where the host is the device."""
    return [name for name in find_options(layer) if not (name == OPTION_OFFLOAD and device_type == "cpu")]


def option_transients(layer: nn.Module, names: Sequence[str], transient: Callable) -> tuple[dict[str, int], dict[str, str]]:
    """({option: its transient bytes}, {option: why it failed}) for the options that run
    forward and backward. transient(fn): the transient bytes of x -> fn(x)."""
    found, failed = {}, {}
    for name in names:
        try:
            found[name] = transient(layer_runner(layer, name))
        except Exception as exc:  # the user's layer under checkpoint: leave the option out, say why
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            failed[name] = f"{type(exc).__name__}: {detail}"[:200]
    return found, failed


def common_per_kind(kinds: Sequence[str], per_layer: Sequence[Sequence[str]]) -> list[list[str]]:
    """Each layer's options cut to those every layer of its kind has, in the first's order."""
    common: dict[str, list[str]] = {}
    for kind, names in zip(kinds, per_layer, strict=True):
        common[kind] = [name for name in common.get(kind, names) if name in names]
    return [list(common[kind]) for kind in kinds]


def saving_per_kind(kinds: Sequence[str], per_layer: Sequence[Sequence[str]], act_bytes: Sequence[int],
                    option_bytes: Sequence[dict[str, int]]) -> list[list[str]]:
    """The options that keep fewer bytes than none on every layer of the kind."""
    wasteful = {(kind, name) for kind, names, act, kept in zip(kinds, per_layer, act_bytes, option_bytes, strict=True)
                for name in names if kept[name] >= act}
    return [[name for name in names if (kind, name) not in wasteful] for kind, names in zip(kinds, per_layer)]


def option_job(layer: nn.Module, x: torch.Tensor, names: Sequence[str], *, plain: FwdBwdJob) -> FwdBwdJob:
    """The plain layer, then each option, in turn (the plain run is the baseline of the differences)."""
    forwards = [plain.forwards[0], *(_forward(layer_runner(layer, name), x) for name in names)]
    return FwdBwdJob(forwards, plain.backward, device=plain.device, before_step=plain.before_step, around=plain.around)


def _forward(run: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: run(x)


def recompute_options(*, act_bytes: int, input_bytes: int, full_ms: float, transient_bytes: int,
                      names: Sequence[str], kept: dict[str, int], transients: dict[str, int],
                      job: FwdBwdJob | None, split: dict[str, tuple[int, int, int, int, int, int]] | None = None,
                      split_ms: dict[str, tuple[float, float, float]] | None = None,
                      bwd_ms: float = 0.0) -> list[RecomputeOption]:
    """The profile's list: none and full from the layer's own numbers (full's recompute the
    measured one, or the whole forward the cost model charges where none was measured), then
    each selective option. split: each option's split backward bytes (held, input peak, weight peak,
    its first group's peak, its last group's carry, what outlives the pass: splitbackward.split_backward_bytes);
    split_ms: its two passes' and its plain backward's times where they were timed (SplitTimeJob),
    recorded against the option's backward, `bwd_ms` (the layer's) and its recompute."""
    split, split_ms = split or {}, split_ms or {}

    def split_fields(name: str, recompute_ms: float = 0.0) -> dict[str, int | float | None]:
        input_ms = weight_ms = None
        if name in split_ms:
            input_ms, weight_ms = recorded_split_ms(split_ms[name], bwd_ms + recompute_ms)
        return {**split_byte_fields(split, name), "input_grad_ms": input_ms, "weight_grad_ms": weight_ms}

    listed = [RecomputeOption(name=OPTION_NONE, kept_bytes=act_bytes, **split_fields(OPTION_NONE)),
              RecomputeOption(name=OPTION_FULL, kept_bytes=input_bytes, recompute_ms=full_ms,
                              recompute_peak_bytes=max(act_bytes - input_bytes, 0), **split_fields(OPTION_FULL, full_ms))]
    if job is None:
        return listed
    (fwd, bwd), *timed = job.stats()
    for name, (option_fwd, option_bwd) in zip(names, timed, strict=True):
        extra_ms = option_fwd.median_ms + option_bwd.median_ms - fwd.median_ms - bwd.median_ms
        listed.append(RecomputeOption(name=name, kept_bytes=kept[name], recompute_ms=max(extra_ms, 0.0),
                                      recompute_peak_bytes=max(transients[name] - transient_bytes, 0),
                                      host_bytes=max(act_bytes - kept[name], 0) if name == OPTION_OFFLOAD else 0,
                                      **split_fields(name, max(extra_ms, 0.0))))
    return listed


def split_byte_fields(split: dict[str, tuple[int, int, int, int, int, int]], name: str) -> dict[str, int]:
    """Option `name`'s split backward bytes as a RecomputeOption records them, from
    splitbackward.split_per_option's (held, input peak, peak, first group's peak, carry, left); zeros where
    torch's split did not run it (refused, or an option no split runs). Measured and fake profiles alike."""
    held, input_peak, peak, first, carry, left = split.get(name, (0, 0, 0, 0, 0, 0))
    return {"split_held_bytes": held, "split_input_peak_bytes": input_peak, "split_peak_bytes": peak,
            "split_first_peak_bytes": first, "split_carry_bytes": carry, "split_left_bytes": left}
