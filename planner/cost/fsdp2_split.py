"""A checkpointed analytic block's forward with what its record does not name split into the parts the cost model
counts, each made and freed where torchtitan's block code makes and frees it (fsdp2_layers.forward_program):
TP + SP's gathered inputs, repeat_kv's copies, context parallelism's K/V buffers, Float8's casts. The points are the
record's (`rerun_points`, analytic_lifetimes.LLAMA_FORWARD_POINTS, read from torchtitan 9dec370, docs/framework-facts.md
§136). Nothing here reads a file or prints."""

from __future__ import annotations

from planner.cost import contextparallel, cpring, repeatedkv, tpgathered
from planner.schema import Profile, TrainSetup

# each part: the point it is made at, the point it is freed at (None: by its own program)
_PLACES = {
    "attention_gathered": ("attention", "attention_end"),
    "repeated_kv": ("sdpa", "attention_end"),
    "cp": ("sdpa", "sdpa_end"),
    "mlp_gathered": ("mlp", "mlp_end"),
    "float8": ("w2", None),
}


def forward_parts(layer, option: int, profile: Profile, setup: TrainSetup) -> dict[str, object]:
    """What the cost model's extra counts for a layer's rerun forward beyond its record, by the term it comes from:
    each gathered input (tpgathered: one per sub-block, equal), repeat_kv's copies (repeatedkv), context
    parallelism's forward buffers as its ring makes them (`cp`: cpring's forward program under the all-gather
    exchange, else one tensor of buffer_bytes' forward) with what the extra charges for them (`cp_charge`,
    contextparallel.extra_bytes). Float8's casts come from the record (fsdp2_layers.forward_program)."""
    inputs = tpgathered.GATHERED_INPUTS.get(layer.kind, 0)
    gathered = tpgathered.tp_gathered_extra_bytes(layer, option, profile, setup)
    parts: dict[str, object] = {"gathered": gathered // inputs if inputs == 2 else 0,
                                "repeated_kv": repeatedkv.repeated_kv_extra_bytes(layer, option, profile, setup),
                                "cp": (), "cp_charge": 0}
    exchange = layer.context_parallel
    if exchange is not None and setup.training.context_parallel > 1 and option == 1:
        exchange = contextparallel.as_exchanged(exchange, setup.training)
        kind = contextparallel.comm_type(setup.training)
        compiled = contextparallel.compiled_ring(setup.training)
        parts["cp"] = cpring.forward_program(exchange.ranks, exchange.q_bytes, exchange.kv_bytes, compiled=compiled) \
            if kind == "allgather" else (contextparallel.buffer_bytes(exchange, kind, compiled=compiled)[0],)
        parts["cp_charge"] = contextparallel.extra_bytes(layer, setup, option)
    return parts


def split_forward(codes: list[int], points: dict[str, int], residual: int, parts: dict) -> tuple[int, ...]:
    """`codes` (the record's rerun_forward) with the parts inserted at their points (`points`: indices into codes)
    and freed at theirs; first what `residual` (the extra beyond the record, Float8's casts with it) holds beyond
    the parts, one tensor alive to the forward's end, where positive; () where a point is missing."""
    if any(start not in points or (end is not None and end not in points) for start, end in _PLACES.values()):
        return ()
    gathered = parts.get("gathered", 0)
    programs = {"attention_gathered": (gathered,), "mlp_gathered": (gathered,),
                "repeated_kv": (parts.get("repeated_kv", 0),), "cp": tuple(parts.get("cp", ())),
                "float8": (parts.get("float8", 0), -1)}
    rest = residual - 2 * gathered - parts.get("repeated_kv", 0) - parts.get("cp_charge", 0) - parts.get("float8", 0)
    out: list[int] = []
    made = 0

    def make(size: int) -> int:
        nonlocal made
        out.append(size)
        made += 1
        return made

    if rest > 0:
        make(rest)
    base: dict[int, int] = {}
    alive: dict[str, list[int]] = {}  # each part's ids still alive
    for at in range(len(codes) + 1):
        for name, (_, end) in _PLACES.items():
            if end is not None and points[end] == at:
                out.extend(-ident for ident in alive.pop(name, []))
        for name, (start, _) in _PLACES.items():
            if points[start] != at or not any(code > 0 for code in programs[name]):
                continue
            local: dict[int, int] = {}  # the part's own ids (from 1, in its program's order) to the program's
            count = 0
            for code in programs[name]:
                if code > 0:
                    count += 1
                    local[count] = make(code)
                else:
                    out.append(-local.pop(-code))
            alive[name] = list(local.values())
        if at < len(codes):
            code = codes[at]
            if code > 0:
                base[len(base) + 1] = make(code)
            else:
                out.append(-base[-code])
    return tuple(out)
