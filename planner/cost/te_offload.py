"""Transformer Engine's layer-window activation offload, as megatron-core runs it under --cpu-offloading
(planner/models/configs/megatron_offload.py reads the flags), read at TransformerEngine v2.9 (git 70f53666,
the TE Megatron-Bridge 25.11 pins, >=2.9.0a0,<2.10.0), transformer_engine/pytorch/cpu_offload.py
(docs/framework-facts.md §107, §112):

- one handler a TransformerBlock, one group a layer; the first N groups are offloaded (tensor_push 356-424: the
  saved tensors TE's modules mark, the layer's input among them, so the whole saved set);
- the window map (343-350): window[i] = (L // N)(i + 1) - 1, + i + 1 for the first L mod N groups, + L mod N after;
- forward (synchronize_on_group_commit_forward 490-551): group 0's copy to the host starts on the d2h stream
  when layer 0's forward ends; when layer window[k]'s forward ends the compute stream waits for the d2h stream,
  group k's device tensors are dropped and group k + 1's copy starts. So group i's copy runs beside layers
  window[i-1] + 1 .. window[i]'s forwards (group 0's: 1 .. window[0]), and group i is on the device from its
  own forward to the end of layer window[i]'s;
- backward (on_group_commit_backward 633-657, bulk_reload_group 560-631): before layer window[j]'s backward the
  compute waits for the h2d stream, then group j's reload is issued into fresh torch.empty_like buffers made on
  the compute stream (no double buffering: megatron-core's default); the compute waits for it before layer
  window[j-1]'s backward (group 0: before layer 0's). So group j's reload runs beside layers window[j-1] + 1 ..
  window[j]'s backwards (group 0's: 1 .. window[0]), and group j is on the device from layer window[j]'s
  backward to the end of its own.

Held while layer k runs (forward or backward): the layers not offloaded up to k, and the offloaded groups j
with j <= k <= window[j]. Time exposed: each copy past the compute it runs beside (the compute waits for it).

TransformerEngine v2.10 (git 769ed778; the same at 4329ff84, v2.17.1, the TE Megatron-LM d98e8a64 pins) replaced
the handler by `DefaultOffloadSynchronizer` (cpu_offload.py 522-593; docs/framework-facts.md §425-§428), which the
record's `te_window_handler` "v2.10" names:

- the maps (548-572): layer i < N released before layer L - N + i's forward and reloaded before layer
  L - 1 - N + i's backward, so window[i] = L - N - 1 + i, the same layer both ways: held at layers i .. window[i]
  (at most L - N layers' saved sets at any layer, one fewer than v2.9's L - N + 1 at its last layer);
- one offload stream for both ways (OffloadSynchronizer 457, start_offload 253-298, start_reload 317-348), the
  copies in issue order: group i's copy issued before layer i + 1's forward (fwd_step 574-584), the compute
  waiting on its event before layer window[i] + 1's (release_activation_forward_gpu_memory 300-315); its reload
  issued before layer window[i]'s backward, after the compute so far (wait_stream 335), the compute waiting on
  each tensor's event at layer i's backward (pop_tensor 373-395): `exposed_ms` plays that queue.
Pure functions; nothing here reads a file or prints.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.cost import reserve, runtimes
from planner.cost.rules import compute_ms
from planner.schema import OPTION_NONE, OPTION_OFFLOAD

V210 = "v2.10"  # the record's te_window_handler for TE v2.10's DefaultOffloadSynchronizer


def handler_of(setup) -> str:
    """The TE offload handler the runtime's record says runs the window (te_window_handler)."""
    return runtimes.of(setup.training).te_window_handler


def window_map(num_layers: int, num_offload: int, *, handler: str = "v2.9") -> list[int]:
    """The layer after whose forward group i is dropped (and before whose backward it is reloaded), for
    i < num_offload: v2.9's cpu_offload.py 343-350 as written; v2.10's L - N - 1 + i (548-572)."""
    if not 0 < num_offload < num_layers:
        raise ValueError(f"{num_offload} groups offloaded of {num_layers}: Transformer Engine's window needs 0 < N < L")
    if handler == V210:
        return [num_layers - num_offload - 1 + i for i in range(num_offload)]
    window, constant = [], 0
    for i in range(num_offload):
        at = (num_layers // num_offload) * (i + 1) - 1
        if i < num_layers % num_offload:
            at += i + 1
            constant = i + 1
        else:
            at += constant
        window.append(at)
    return window


def held_groups(num_layers: int, num_offload: int, layer: int, *, handler: str = "v2.9") -> list[int]:
    """The offloaded groups on the device while `layer` runs its forward or its backward."""
    window = window_map(num_layers, num_offload, handler=handler)
    return [j for j in range(num_offload) if j <= layer <= window[j]]


def copy_windows(num_layers: int, num_offload: int) -> list[range]:
    """The layers whose compute group i's copy (forward: to the host; backward: back) runs beside."""
    window = window_map(num_layers, num_offload)
    return [range(1 if i == 0 else window[i - 1] + 1, window[i] + 1) for i in range(num_offload)]


def extra_bytes(saved: Sequence[int], num_offload: int, *, handler: str = "v2.9") -> list[int]:
    """Each layer's offloaded groups held beside it (`saved`: every layer's saved bytes, in block order; the
    first num_offload are offloaded): the bytes layer k holds beyond the layers not offloaded."""
    return [sum(saved[j] for j in held_groups(len(saved), num_offload, k, handler=handler))
            for k in range(len(saved))]


def exposed_ms(saved: Sequence[int], fwd_ms: Sequence[float], bwd_ms: Sequence[float], num_offload: int, *,
               ms_per_byte: float, handler: str = "v2.9") -> list[tuple[float, float]]:
    """Each offloaded group's (forward, backward) time the compute waits for: its copy (`saved[i]` bytes at
    `ms_per_byte`, the host link, one copy stream each way) past the compute of the layers it runs beside
    (`fwd_ms`, `bwd_ms`: every layer of the block's). v2.10: one_stream_exposed_ms."""
    if handler == V210:
        return one_stream_exposed_ms(saved, fwd_ms, bwd_ms, num_offload, ms_per_byte=ms_per_byte)
    spans = copy_windows(len(fwd_ms), num_offload)
    return [(max(0.0, saved[i] * ms_per_byte - sum(fwd_ms[k] for k in span)),
             max(0.0, saved[i] * ms_per_byte - sum(bwd_ms[k] for k in span)))
            for i, span in enumerate(spans)]


def one_stream_exposed_ms(saved: Sequence[int], fwd_ms: Sequence[float], bwd_ms: Sequence[float], num_offload: int,
                          *, ms_per_byte: float) -> list[tuple[float, float]]:
    """v2.10's waits, group by group (forward, backward), on its one offload stream, the copies queued in issue
    order: group i's copy issued as layer i + 1's forward begins (start_offload, no sooner: the host issues it
    there), the compute waiting for it as layer window[i] + 1's begins (release); every copy out done by layer
    L - 1's forward (window[N - 1] + 1), so the backward's queue starts empty: group i's reload issued as layer
    window[i]'s backward begins, the compute waiting for it as layer i's begins (pop_tensor)."""
    num_layers = len(fwd_ms)
    window = window_map(num_layers, num_offload, handler=V210)
    out = [[0.0, 0.0] for _ in range(num_offload)]
    now = stream = 0.0
    done: dict[int, float] = {}
    for k in range(num_layers):
        if 0 < k <= num_offload:  # fwd_step: layer k - 1's copy issued
            stream = max(stream, now) + saved[k - 1] * ms_per_byte
            done[k - 1] = stream
        for j in (j for j in range(num_offload) if window[j] + 1 == k):  # then the release waits for it
            out[j][0] = max(0.0, done[j] - now)
            now += out[j][0]
        now += fwd_ms[k]
    now = stream = 0.0
    for k in range(num_layers - 1, -1, -1):
        for j in (j for j in range(num_offload) if window[j] == k):  # bwd_step: the reload issued
            stream = max(stream, now) + saved[j] * ms_per_byte
            done[j] = stream
        if k < num_offload:  # layer k's pops wait for its reload
            out[k][1] = max(0.0, done[k] - now)
            now += out[k][1]
        now += bwd_ms[k]
    return [(fwd, bwd) for fwd, bwd in out]


def window_layers(kinds: Sequence[str], offloaded: Sequence[bool]) -> tuple[list[int], int] | None:
    """The stage's block (the indices of the layers of the offloaded layers' kind, in order) and N, where the
    offloaded layers are the block's first N and N < its length: the layers Transformer Engine's handler
    windows. None where they are not (ckplan's per-layer option then charges them)."""
    if not any(offloaded):
        return None
    kind = {k for k, off in zip(kinds, offloaded) if off}
    block = [i for i, k in enumerate(kinds) if k in kind]
    count = sum(offloaded)
    if len(kind) != 1 or any(not offloaded[i] for i in block[:count]) or count >= len(block):
        return None
    return block, count


def window_per_layer(per_layer: Sequence[dict[str, float]], none: Sequence[dict[str, float] | None],
                     kinds: Sequence[str], fwd_ms: Sequence[float], bwd_ms: Sequence[float], *,
                     ms_per_byte: float | None, handler: str = "v2.9") -> list[dict[str, float]] | None:
    """The stage's per-layer quantities (assembly.stage_sums': kept, extra, offloaded, time...) with its
    offloaded layers (none[i] not None: their values under `none`) charged as Transformer Engine's window
    runs them: each offloaded layer keeps nothing past its window (its whole saved set, `none`'s kept, on the
    host: offloaded), every layer of the block holds the offloaded groups held beside it on top of its own
    extra (net_extra_bytes nets the layers after it), and each group's exposed copy time (`ms_per_byte`: the
    host link; None: not timed) adds to its layer's time (`handler`: the record's te_window_handler). None where
    the window does not apply."""
    found = window_layers(kinds, [v is not None for v in none])
    if found is None:
        return None
    block, count = found
    out = [dict(values) for values in per_layer]
    saved = [int(none[i]["kept"]) if i in block[:count] else int(per_layer[i]["kept"]) for i in block]
    for g, i in enumerate(block[:count]):
        out[i] = dict(none[i])
        out[i]["offloaded"] = out[i].get("offloaded", 0.0) + saved[g]
        out[i]["kept"] = 0.0
    for at, i in enumerate(block):
        out[i]["extra"] += sum(saved[j] for j in held_groups(len(block), count, at, handler=handler))
    if ms_per_byte is not None:
        exposed = exposed_ms(saved, [fwd_ms[i] for i in block], [bwd_ms[i] for i in block], count,
                             ms_per_byte=ms_per_byte, handler=handler)
        for (fwd, bwd), i in zip(exposed, block[:count]):
            out[i]["time"] += fwd + bwd
    return out


def window_runs(setup) -> bool:
    """Whether a stage's offloaded layers may be Transformer Engine's window (stage_window): the runtime's
    record says its offload is that handler and the pipeline has one stage. There an offload is a choice of
    the stage (the block's first N layers, charged together), not of a layer, so the solvers' per-layer rows
    do not take it (useful.useful_options)."""
    return setup.pipeline.stages * setup.pipeline.chunks == 1 and runtimes.of(setup.training).te_window_offload


def plan_window(kinds: Sequence[str], options: Sequence[str], setup) -> tuple[list[int], int] | None:
    """(the block, N) where a plan (`options`: each layer's option name, in model order; `kinds`: each layer's
    kind) is Transformer Engine's window as megatron-core runs it: the runtime's handler at one stage
    (window_runs), the offloaded layers the block's first N, and nothing recomputed beside it (TransformerConfig
    refuses --cpu-offloading with recompute, docs/framework-facts.md §321); else None."""
    if not window_runs(setup) or any(option not in (OPTION_NONE, OPTION_OFFLOAD) for option in options):
        return None
    return window_layers(kinds, [option == OPTION_OFFLOAD for option in options])


def pipeline_refuses(setup) -> bool:
    """Whether the runtime refuses the layers' offload for this pipeline: more than one stage (chunks included)
    where its record says it runs none beside a pipeline (offload_refuses_pipeline: megatron-core's
    TransformerConfig)."""
    return setup.pipeline.stages * setup.pipeline.chunks > 1 and runtimes.of(setup.training).offload_refuses_pipeline


def stage_window(layers: Sequence, options: Sequence[int], per_layer: list[dict[str, float]], rows,
                 ctx) -> list[dict[str, float]] | None:
    """The stage's per-layer values with its offloaded layers as Transformer Engine's window handler runs them
    (window_per_layer), where the runtime's record says its offload is that handler
    (te_window_offload), the pipeline has one stage (megatron-core refuses --cpu-offloading with PP) and the
    offloaded layers are the block's first N; else None (ckplan's per-layer option stands)."""
    setup = ctx.setup
    if not window_runs(setup):
        return None
    offloaded = [layer.options[int(ckpt)].name == OPTION_OFFLOAD for layer, ckpt in zip(layers, options)]
    if not any(offloaded):
        return None
    none = [{q: sum(term.value(layer, 0, ctx) for term in rows if term.quantity == q) for q in per_layer[0]}
            if off else None for layer, off in zip(layers, offloaded)]
    return window_per_layer(per_layer, none, [layer.kind for layer in layers],
                            [compute_ms(layer.fwd_ms, setup.time) for layer in layers],
                            [compute_ms(layer.bwd_ms, setup.time) for layer in layers],
                            ms_per_byte=reserve.host_copy_ms_per_byte(ctx.profile, setup), handler=handler_of(setup))
