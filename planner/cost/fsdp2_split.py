"""A checkpointed analytic block's forward with what its record does not name split into the parts the cost model
counts, each made and freed where torchtitan's block code makes and frees it (fsdp2_layers.forward_program):
TP + SP's gathered inputs, repeat_kv's copies, context parallelism's K/V buffers, Float8's casts (each linear's at its
matmul, torchao eab345c, §138). The points are the record's (`rerun_points`, analytic_lifetimes.LLAMA_FORWARD_POINTS,
read from torchtitan 9dec370, docs/framework-facts.md §136). Nothing here reads a file or prints."""

from __future__ import annotations

from planner.cost import contextparallel, cpring, float8, repeatedkv, tpgathered
from planner.cost.rules import profile_tp
from planner.schema import Profile, TrainSetup

SCALE_BYTES = 4  # a tensorwise cast's scale: one fp32 (torchao eab345c float8_utils.py 36-50 `amax_to_scale`)
# each converted linear of torchtitan's LLaMA block (Float8Cast.linear): the point its casts are made at
# (analytic_lifetimes.LLAMA_FORWARD_POINTS; `w2_input`: where the product becomes w2's argument, split_forward), and,
# for the last linear reading an input, the point that input's cast is freed at (the same point: with the linear)
_CAST_AT = {"attention.wq": "qkv", "attention.wk": "qkv", "attention.wv": "qkv", "attention.wo": "wo",
            "feed_forward.w1": "w1", "feed_forward.w3": "w3", "feed_forward.w2": "w2_input"}
_CAST_END = {"attention.wv": "qkv", "attention.wo": "attention_end", "feed_forward.w3": "w13_end",
             "feed_forward.w2": "mlp_end"}
# the module whose input TP + SP's Float8 plan casts before gathering it (Float8Cast.source), by its gathered part
_PRE_GATHER = {"attention_norm": "attention_gathered", "ffn_norm": "mlp_gathered"}

# each part: the point it is made at, the point it is freed at (None: by its own program)
_PLACES = {
    "attention_gathered": ("attention", "attention_end"),
    "repeated_kv": ("sdpa", "attention_end"),
    "cp": ("sdpa", "sdpa_end"),
    "mlp_gathered": ("mlp", "mlp_end"),
    "float8": ("w2", None),
}
# TP + SP's row-parallel linears (wo, w2: torchtitan 9dec370 parallelize_llama.py `RowwiseParallel(output_layouts=
# Shard(1))`): each matmul's whole partial sum, then its reduce-scattered sequence shard, the partial freed as the
# shard is made (docs/framework-facts.md §149); made after the linear's casts, the shard alive until the residual
# sum that reads it is made (`attention_sum`; w2's: the block's output, made at the forward's end)
_ROW_PARALLEL = {"wo_scatter": ("wo", "attention_sum"), "w2_scatter": ("w2_input", "mlp_end")}


def forward_parts(layer, option: int, profile: Profile, setup: TrainSetup) -> dict[str, object]:
    """What the cost model's extra counts for a layer's rerun forward beyond its record, by the term it comes from:
    each gathered input (tpgathered: one per sub-block, equal, beyond the sequence shard; `shard`: that shard, the
    record's norm output, which the caller holds beside the gathered tensor until the sub-module returns, so the
    forward plays the gathered tensor whole, docs/framework-facts.md §144), repeat_kv's copies (repeatedkv), context
    parallelism's forward buffers as its ring makes them (`cp`: cpring's forward program under the all-gather
    exchange, else one tensor of buffer_bytes' forward) with what the extra charges for them (`cp_charge`,
    contextparallel.extra_bytes), Float8's forward casts linear by linear under a full recompute (`float8_casts`:
    cast_places of float8.forward_casts, docs/framework-facts.md §138), and under TP + SP each row-parallel
    linear's whole partial sum before its reduce-scatter (`row_partial`: t x the sequence shard, in the activations'
    dtype, Float8's scaled matmul's output too; its output is a new shard, `shard` bytes; §149): neither is a term
    of the cost model's extra. What the extra charges for Float8's casts comes from the record (`float8`,
    fsdp2_layers.forward_program)."""
    inputs = tpgathered.GATHERED_INPUTS.get(layer.kind, 0)
    gathered = tpgathered.tp_gathered_extra_bytes(layer, option, profile, setup)
    parts: dict[str, object] = {"gathered": gathered // inputs if inputs == 2 else 0,
                                "shard": layer.input_bytes if gathered and inputs == 2 else 0,
                                "row_partial": profile_tp(profile) * layer.input_bytes if gathered and inputs == 2 else 0,
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
    known = next((item for item in profile.layers if item.name == layer.name), None)
    parts["float8_casts"] = cast_places(float8.forward_casts(known, setup)) if known is not None and option == 1 else ()
    return parts


def cast_places(casts) -> tuple[tuple[str, str, str | None, tuple[int, ...]], ...]:
    """Float8's forward casts (float8.forward_casts) as places of split_forward: (name, point made at, point freed
    at or None: by its program, program). A sequence shard's cast before TP's gather: (`pre:` + the gathered
    part's name, its bytes): split_forward makes it and its scale before that part and frees the copy once the part
    is made (the gathered float8 tensor keeps the scale: torchao eab345c float8_ops.py 374-400 `allgather_fp8`).
    Each input's cast with its scale from its first reader's point to its last's end (compiled, CSE: one cast a
    tensor), each weight's with its scale made and freed at its linear's point (torch's checkpoint saves neither).
    () where a linear is not one of torchtitan's LLaMA block's (the charge at w2 then stands)."""
    if not casts or any(cast.linear not in _CAST_AT for cast in casts):
        return ()
    places, done = [], set()
    for cast in casts:
        if cast.shard_bytes and cast.source in _PRE_GATHER and cast.source not in done:
            places.append((f"pre:{_PRE_GATHER[cast.source]}", _CAST_AT[cast.linear], None, (cast.shard_bytes,)))
        elif cast.input_bytes and cast.source not in done:
            last = [item.linear for item in casts if item.source == cast.source][-1]
            places.append((f"input:{cast.source}", _CAST_AT[cast.linear], _CAST_END.get(last, _CAST_AT[last]),
                           (cast.input_bytes, SCALE_BYTES)))
        done.add(cast.source)
        if cast.weight_bytes:
            places.append((f"weight:{cast.linear}", _CAST_AT[cast.linear], None,
                           (cast.weight_bytes, SCALE_BYTES, -1, -2)))
    return tuple(places)


def split_forward(codes: list[int], points: dict[str, int], residual: int, parts: dict) -> tuple[int, ...]:
    """`codes` (the record's rerun_forward) with the parts inserted at their points (`points`: indices into codes)
    and freed at theirs; first what `residual` (the extra beyond the record, Float8's casts with it) holds beyond
    the parts, one tensor alive to the forward's end, where positive; () where a point is missing. Float8's casts:
    each linear's at its matmul where `float8_casts` (cast_places) holds them, else the record's charge
    (`float8`: the largest linear's backward casts) at w2's, an upper bound. `w2_input`: the index where the
    product's own free falls after the point `w2` (the frees before it are SiLU's and w3's outputs, which `*`
    consumed; the MLP's input, feed_forward's argument, the record frees after it), that is where w2 takes the
    product as its argument. A gathered input is played whole (`gathered` + `shard`), what the extra charges for it
    (`gathered`) taken out of `residual`. A row-parallel linear's partial sum (`row_partial`, where the record holds
    `attention_sum`) beside its reduce-scattered shard, after the linear's casts, the shard freed at its residual
    sum (wo's) or at the MLP's end (w2's); the extra holds neither."""
    casts = tuple(parts.get("float8_casts", ()))
    if "w2" not in points or any(start not in points and start != "w2_input" or end is not None and end not in points
                                 for _, start, end, _ in casts):
        casts = ()  # a record without the linears' points: the charge at w2
    places = {name: (start, end) for name, (start, end) in _PLACES.items() if not (casts and name == "float8")}
    places.update({name: (start, end) for name, start, end, _ in casts if not name.startswith("pre:")})
    partial = parts.get("row_partial", 0)
    if partial and all(point in points for point in ("wo", "attention_sum", "w2", "mlp_end")):
        places.update(_ROW_PARALLEL)  # after the casts: each linear's matmul reads them
    if any(start not in points and start != "w2_input" or (end is not None and end not in points)
           for start, end in places.values()):
        return ()
    points = {**points, "w2_input": _input_free(codes, points["w2"]) if "w2" in points else 0}
    gathered = parts.get("gathered", 0)
    whole = gathered + parts.get("shard", 0) if gathered else 0  # the gathered tensor, beside the record's shard
    programs = {"attention_gathered": (whole,), "mlp_gathered": (whole,),
                "repeated_kv": (parts.get("repeated_kv", 0),), "cp": tuple(parts.get("cp", ())),
                "float8": (parts.get("float8", 0), -1)}
    if partial:  # the partial sum, the reduce-scattered shard beside it, the partial freed
        programs.update({name: (partial, parts.get("shard", 0), -1) for name in _ROW_PARALLEL})
    for name, _, _, program in casts:
        if name.startswith("pre:"):  # the shard's copy and its scale, the gathered part, the copy freed
            target = name[len("pre:"):]
            shard = program[0]
            programs[target] = (shard, SCALE_BYTES, whole, -1) if whole else (shard, SCALE_BYTES, -1, -2)
        else:
            programs[name] = program
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
    folded: list[int] = []  # ids of parts freed at the point they are made at
    for at in range(len(codes) + 1):
        for name, (_, end) in places.items():
            if end is not None and points[end] == at:
                out.extend(-ident for ident in alive.pop(name, []))
        for name, (start, end) in places.items():
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
            if end is not None and points[end] <= at:  # freed where it is made: once the point's other parts ran
                folded.extend(local.values())
            else:
                alive[name] = list(local.values())
        out.extend(-ident for ident in folded)
        folded.clear()
        if at < len(codes):
            code = codes[at]
            if code > 0:
                base[len(base) + 1] = make(code)
            else:
                out.append(-base[-code])
    return tuple(out)


def _input_free(codes: list[int], at: int) -> int:
    """The index in `codes` of the free of the tensor made last before index `at` (split_forward's `w2_input`), at
    or after `at` within the frees that follow it; `at` where it is not freed there."""
    ident = sum(1 for code in codes[:at] if code > 0)
    for index in range(at, len(codes)):
        if codes[index] == -ident:
            return index
        if codes[index] > 0:
            break
    return at
