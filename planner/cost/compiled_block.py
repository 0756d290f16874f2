"""A compiled, fully checkpointed block charged by its compiled record (issue 33; docs/published-runs.md §41.cblock).

Where the job compiles each block with its checkpoint inside (compiledrerun.rerun_partitioned: the setup's compile on
a runtime whose record compiles the model one block at a time) and the profile carries the record inductor's wrappers
make for that block under the job's settings (LayerProfile.compiled_records, planner/profiler/compiled_blocks.py:
Float8 linears, AsyncTP's fused ops), the block's backward is that record's program, not the eager block's terms:
- the cost model's extra for the layer is the record's backward peak (its own buffers, the received gradient of the
  block's output first) in place of the eager terms the compiled backward holds instead: the layer's transient and
  rerun (Float8's casts in it), the rerun's all-gathered TP inputs and repeat_kv's copies, and under context
  parallelism the ring's buffers (contextparallel.extra_bytes): torch 2.6.0's ring is traced into the block's one
  graph (fullgraph, no graph break: docs/framework-facts.md §30, §456), so a record read at the job's CP degree holds
  it (scripts/compiled_block_cp.py, §42.cpblock). What runs outside the compiled graph stays charged as before:
  FSDP2's gathered weights and gradients, the pipeline's buffers;
- the FSDP2 replay (fsdp2_layers.chunk_layers) plays the record's forward (the forward wrapper's buffers, freed where
  it frees them) and its backward less the weights' gradients, which FSDP2's replay makes itself, each where the
  record makes it (`grads_at`); under CP, the record's ring and no cpring program beside it.
Under no other settings or option, and on any other layer, nothing changes."""

from __future__ import annotations

from planner.cost import compiledrerun, contextparallel, cpring, runtimes
from planner.cost.layers import LayerCost
from planner.cost.repeatedkv import repeated_kv_extra_bytes
from planner.cost.rules import layer_extra_bytes
from planner.cost.tpgathered import tp_gathered_extra_bytes
from planner.schema import OPTION_FULL, AllocRecord, LayerProfile, Profile, TrainSetup


def settings_key(setup: TrainSetup) -> str:
    """The key the profile's compiled records are held by for this job (compiled_blocks.settings_key's form): "float8"
    for torchao's Float8 linears as eab345c runs them, which save their float8 input (the record's
    float8_saves_input, torchtitan 9dec370's: the records were read at eab345c), "float8-recast" for a torchao that
    casts the saved bf16 input again in the backward (another program: no record read); "async-tp"; "cp<N>" under
    context parallelism by torch's all-gather ring, the readings' ("cp<N>-<exchange>" for another: none read)."""
    settings = []
    record = runtimes.of(setup.training)
    if setup.training.float8 and record.float8 == "torchao":
        settings.append("float8" if record.float8_saves_input else "float8-recast")
    if setup.comm.tp_overlap == "async-tp":
        settings.append("async-tp")
    if setup.comm.cp > 1:  # the CP readings ran torch's all-gather rotater (scripts/compiled_block_cp.py): another
        # exchange (--cp-comm p2p, torch's alltoall rotation) is another program in the graph, no record read for it
        kind = contextparallel.comm_type(setup.training)
        settings.append(f"cp{setup.comm.cp}" if kind == "allgather" else f"cp{setup.comm.cp}-{kind}")
    return ",".join(sorted(settings))


def record(known: LayerProfile, option: str, setup: TrainSetup) -> AllocRecord | None:
    """The layer's compiled record where the job plays it (module docstring), else None."""
    if option != OPTION_FULL or not known.compiled_records:
        return None
    if not compiledrerun.rerun_partitioned(known.kind, setup.training):
        return None
    return known.compiled_records.get(settings_key(setup))


def backward_without_grads(found: AllocRecord) -> tuple[list[int], tuple[tuple[int, int], ...]]:
    """The record's backward less the weights' gradients (their allocations; the backward never frees them), and for
    each, (the index in that program of the code it was made before, its parameter's index)."""
    made = sum(1 for code in found.forward if code > 0)
    grads = {ident: part for part, ident in enumerate(found.param_grads) if ident}
    program: list[int] = []
    at: list[tuple[int, int]] = []
    renumber: dict[int, int] = {}
    kept = made
    for code in found.backward:
        if code > 0:
            made += 1
            if made in grads:
                at.append((len(program), grads[made]))
                continue
            kept += 1
            renumber[made] = kept
            program.append(code)
        elif -code in grads:
            continue
        else:
            program.append(-renumber.get(-code, -code))
    return program, tuple(at)


def grads_at(found: AllocRecord, program: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """Where the replay makes the weights' gradients in `program` (backward_hand's of the layer as_layer_record gives:
    what it plays first, then the record's allocations in order): each before the allocation the record makes next
    after it (past the program's end where none follows), with its parameter's index (fsdp2_layers.grads_order's
    form)."""
    stripped, places = backward_without_grads(found)
    allocs = [at for at, code in enumerate(program) if code > 0]
    own = sum(1 for code in stripped if code > 0)
    first = len(allocs) - own  # the program's allocations before the record's (the received gradient, a residual)
    out = []
    for at, part in places:
        n = first + sum(1 for code in stripped[:at] if code > 0)
        out.append((allocs[n] if n < len(allocs) else len(program), part))
    return tuple(out)


def backward_peak(found: AllocRecord, incoming: int) -> int:
    """The most the record's backward (less the weights' gradients) holds at once beyond what the forward left, with
    the block's output's gradient (`incoming`) alive throughout."""
    program, _ = backward_without_grads(found)
    return cpring.peak(program, made=sum(1 for code in found.forward if code > 0), live=incoming)


def as_layer_record(known: LayerProfile, found: AllocRecord) -> LayerProfile:
    """The layer as the FSDP2 replay reads it: its full option's record the compiled one less the weights'
    gradients (backward_without_grads), its backward's ids the ones that program gives them."""
    program, _ = backward_without_grads(found)
    grad_ids = {ident for ident in found.param_grads if ident}
    input_grad = found.input_grad - sum(1 for ident in grad_ids if ident < found.input_grad)
    stripped = found.model_copy(update={"backward": program, "param_grads": [], "input_grad": input_grad})
    return known.model_copy(update={"alloc_records": {**known.alloc_records, OPTION_FULL: stripped}})


def forward_peak(found: AllocRecord) -> int:
    """The most the record's forward holds at once (its output and saved tensors among it)."""
    return cpring.peak(found.forward)


def _known(layer: LayerCost, profile: Profile) -> LayerProfile | None:
    return next((known for known in profile.layers if known.name == layer.name), None)


def incoming_bytes(layer: LayerCost, option: int, profile: Profile, setup: TrainSetup) -> int | None:
    """Of the compiled record's peak (extra_bytes'), the received gradient of the block's output: the peak less the
    peak without it, where the backward sets it (planner/cost/boundgrad.py); None where no record plays."""
    if option != 1 or not compiledrerun.rerun_partitioned(layer.kind, setup.training):
        return None
    known = _known(layer, profile)
    found = None if known is None else record(known, OPTION_FULL, setup)
    if found is None:
        return None
    forward = forward_peak(found)
    return max(backward_peak(found, layer.output_bytes), forward) - max(backward_peak(found, 0), forward)


def extra_bytes(layer: LayerCost, option: int, profile: Profile, setup: TrainSetup) -> int:
    """The compiled record's peak in place of the eager terms it replaces (module docstring): the record's, less the
    layer's transient and rerun, the rerun's gathered TP inputs, repeat_kv's copies and the CP ring's buffers; 0 where
    no record plays."""
    if option != 1 or not compiledrerun.rerun_partitioned(layer.kind, setup.training):
        return 0  # before the profile's layer is looked up: a scan of the layers, per layer (8,000 layers: 6 s)
    known = _known(layer, profile)
    found = None if known is None else record(known, OPTION_FULL, setup)
    if found is None:
        return 0
    compiled = max(backward_peak(found, layer.output_bytes), forward_peak(found))
    eager = layer_extra_bytes(layer, option) + tp_gathered_extra_bytes(layer, option, profile, setup) \
        + repeated_kv_extra_bytes(layer, option, profile, setup) + contextparallel.extra_bytes(layer, setup, option)
    return compiled - eager


ROWS = (
    (
        "the compiled block's backward as inductor's wrappers make it, in place of the eager block's rerun, scratch, "
        "gathered TP inputs and repeated K/V",
        "extra",
        "layer",
        lambda layer, ckpt, ctx: extra_bytes(layer, int(ckpt), ctx.profile, ctx.setup),
        "the profile's compiled record (LayerProfile.compiled_records: torch 2.6.0 and torchao eab345c's wrappers of "
        "torchtitan 9dec370's block, read at two widths and scaled by each buffer's shape, planner/profiler/"
        "compiled_blocks.py) where the job compiles each block with its checkpoint (planner/cost/compiled_block.py)",
    ),
)
