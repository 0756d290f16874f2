"""A compiled block's allocation record, read from inductor's two wrappers (issue 33; docs/published-runs.md
§41.cblock), and the law that takes it from the widths it was read at to a profile's.

torch.compile partitions a block into a forward and a backward graph (AOTAutograd) and inductor writes each as a
Python wrapper that allocates every buffer (`empty_strided_*`, a fallback kernel's output), releases it (`del`, a
name rebound by `# reuse`) and returns the graph's outputs: the forward's user output, then what the partition
saves; the backward's gradients, one per forward input (planner/profiler/inductor_buffers.py reads them). The
record is those storages in that order, as AllocRecord codes (n > 0 allocates n bytes, the next id; -k frees id k):
- forward: every storage the forward wrapper makes (its inputs, the block's input and its weights, are not its
  own), freed where the wrapper releases it or, not returned, when `call` returns; `output` its user output;
- backward: the ids continue the forward's; the storages the backward wrapper makes, the saved storages the forward
  made freed where the backward releases them; `input_grad` the gradient of the block's input (the first returned),
  `param_grads` the weights' gradients (the rest), by the block's parameters in parameter_parts' order.

Scaling (`scaled`). Two readings of the same block at uniform scales s_a < s_b (every width but the head counts, and
the tokens, divided by the same factor: 1/8 and 1/4 of the rows') make the same statements, so their records have the
same codes with only the allocations' bytes differing; a buffer's bytes are its shape's product times its dtype's, each
dimension either a token count or a width (grows with s) or a head count or a scalar's (does not), so b(s) = b(1) s^d
with d whole (0: a float8 scale, the rng state; 1: the attention's logsumexp; 2: a tokens x width activation, a
weight): d = log(b_b / b_a) / log(s_b / s_a), checked whole and exact, and the record at the rows' widths is
b_a (1 / s_a)^d. Nothing else is fitted: a reading whose codes differ, or whose bytes do not scale by a whole power,
is refused.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from fractions import Fraction

from planner.profiler.inductor_buffers import graph_input_bytes, ir_buffer_bytes, run_call
from planner.schema import AllocRecord


@dataclass(frozen=True)
class Wrapper:
    """One graph as TORCH_COMPILE_DEBUG leaves it: output_code.py, fx_graph_readable.py, ir_post_fusion.txt."""

    code: str
    fx: str
    ir: str = ""


# a CPU kernel inductor writes for nothing but SDPA's layout constraint: its name is the op's alone (the CPU op's, or
# the CUDA flash op's where a reading calls it on CPU: context parallelism's ring, scripts/compiled_block_cp.py)
_CPU_SDPA_COPY = re.compile(r"^(cpp_fused__scaled_dot_product_flash_attention(?:_for_cpu)?(?:_backward)?_\d+) = "
                            r"async_compile\.cpp_pybinding\((\[.*?\])", re.M)


def cpu_layout_copies(code: str) -> frozenset[str]:
    """The buffers a CPU wrapper makes only to meet SDPA's stride constraint, which a CUDA lowering does not make:
    torch 2.6.0 _inductor/lowering.py 2338-2367 `sdpa_constraint` requires every SDPA input in contiguous stride
    order where `not meta_val.is_cuda`, and on CUDA keeps an aligned realized input's strides (`is_aligned_realized_
    tensor`: K and V expanded to the query heads by repeat_kv, stride 0, pass as views; under CP the ring's gradient
    of each step's output, a transposed view of wo's input gradient, strides multiples of 8, passes as a view too,
    where CPU copies it once a flash backward). They are the outputs (the non-const pointers of its signature) of a
    kernel whose name is the SDPA op's alone."""
    found = set()
    for name, signature in _CPU_SDPA_COPY.findall(code):
        outputs = [at for at, kind in enumerate(ast.literal_eval(signature)) if not kind.startswith("const")]
        for call in re.findall(rf"^\s*{name}\((.*)\)$", code, re.M):
            arguments = [a.strip() for a in call.split(",")]
            found.update(arguments[at] for at in outputs if at < len(arguments))
    return frozenset(found)


def _call(wrapper: Wrapper):
    return run_call(wrapper.code, graph_input_bytes(wrapper.fx), buffer_bytes=ir_buffer_bytes(wrapper.ir),
                    unallocated=cpu_layout_copies(wrapper.code))


def _owned(result, returned_alive: set[int]) -> list[int]:
    """The call's events over the storages it makes (not its inputs'), then the frees of the ones `call`'s return
    drops (made, never released, not returned)."""
    events = [e for e in result.events if abs(e) not in result.inputs]
    made = {e for e in events if e > 0}
    released = {-e for e in events if e < 0}
    events += [-key for key in sorted(made - released - returned_alive)]
    return events


def block_record(forward: Wrapper, backward: Wrapper, param_order: tuple[int, ...] = ()) -> AllocRecord:
    """The block's record from its forward and backward wrappers. `param_order`: for each gradient the backward returns
    after the input's, the index among the layer's parameters (parameter_parts' order) of its weight; () leaves
    param_grads empty."""
    return block_record_calls(forward, backward, param_order)[0]


def block_record_calls(forward: Wrapper, backward: Wrapper, param_order: tuple[int, ...] = ()
                       ) -> tuple[AllocRecord, list[tuple[int, tuple[int, int, int, int]]]]:
    """block_record's record, and each flash attention backward call in its backward: (the index into
    `record.backward` before which the call returns, its outputs made; its query's [batch, heads, length, head dim]
    at the reading's widths), where the kernel's own workspace falls (with_workspaces)."""
    fwd = _call(forward)
    returned = [key for key in fwd.returned_storages if key >= 0]
    ids: dict[int, int] = {}
    codes: list[int] = []
    for event in _owned(fwd, set(returned)):
        if not fwd.storage_bytes[abs(event)]:
            continue  # a fallback's tuple, a scalar's view: no storage of its own
        if event > 0:
            ids[event] = len(ids) + 1
            codes.append(fwd.storage_bytes[event])
        else:
            codes.append(-ids[-event])
    output = ids.get(fwd.returned_storages[0], 0)
    saved = fwd.returned_storages[1:]
    # the backward's arguments: the saved tensors in the forward's order, then the outputs' gradients
    arg_names = _argument_names(backward.code)
    saved_ids = {name: ids.get(key, 0) for name, key in zip(arg_names, saved)}
    bwd = _call(backward)
    arg_key = _argument_keys(backward.code, bwd)
    forward_id = {arg_key[name]: saved_ids[name] for name in arg_names if saved_ids.get(name)}
    returned_b = [key for key in bwd.returned_storages]
    alive_end = {key for key in returned_b if key >= 0}
    bcodes: list[int] = []
    made = len(ids)
    bids: dict[int, int] = {}
    calls = dict(bwd.flash_backward)
    places: list[tuple[int, tuple[int, int, int, int]]] = []
    for at, event in enumerate(bwd.events):
        if at in calls:
            places.append((len(bcodes), calls[at]))
        key = abs(event)
        if key in bwd.inputs:
            if event < 0 and key in forward_id:
                bcodes.append(-forward_id[key])
            continue
        if not bwd.storage_bytes[key]:
            continue  # as the forward's
        if event > 0:
            made += 1
            bids[key] = made
            bcodes.append(bwd.storage_bytes[key])
        else:
            bcodes.append(-bids[key])
    places += [(len(bcodes), shape) for at, shape in bwd.flash_backward if at >= len(bwd.events)]
    dropped = [key for key in bids if key not in alive_end and -bids[key] not in bcodes]
    bcodes += [-bids[key] for key in dropped]
    bcodes += [-ident for ident in forward_id.values() if -ident not in bcodes]  # saved, released as call returns
    input_grad = bids.get(returned_b[0], 0) if returned_b and returned_b[0] >= 0 else 0
    grads = [0] * (max(param_order) + 1 if param_order else 0)
    for at, key in enumerate(returned_b[1:1 + len(param_order)]):
        if key >= 0 and key in bids:
            grads[param_order[at]] = bids[key]
    return AllocRecord(forward=codes, backward=bcodes, output=output, input_grad=input_grad, param_grads=grads), places


def with_workspaces(record: AllocRecord, workspaces: list[tuple[int, list[int]]]) -> AllocRecord:
    """The record with a kernel's own transient buffers in its backward: each (index into `backward` before which the
    buffers exist, their bytes in the order the kernel makes them), made there and freed, last first, before the
    backward's next code (the call's return). Later ids move up by those made before them."""
    backward = list(record.backward)
    made_before = sum(1 for code in record.forward if code > 0)
    shift = [(made_before + sum(1 for code in backward[:at] if code > 0) + 1, sum(1 for size in sizes if size > 0))
             for at, sizes in workspaces]  # (the first of the record's ids made after them, how many they move it)

    def moved(ident: int) -> int:
        return ident + sum(n for first, n in shift if ident >= first)

    out: list[int] = []
    pending = sorted(workspaces)
    taken = 0
    for at in range(len(backward) + 1):
        while pending and pending[0][0] == at:
            sizes = [size for size in pending.pop(0)[1] if size > 0]
            ids = [made_before + sum(1 for code in backward[:at] if code > 0) + taken + k + 1
                   for k in range(len(sizes))]
            out += sizes + [-ident for ident in reversed(ids)]
            taken += len(sizes)
        if at < len(backward):
            code = backward[at]
            out.append(code if code > 0 else -moved(-code))
    return record.model_copy(update={
        "backward": out,
        "input_grad": moved(record.input_grad) if record.input_grad else 0,
        "param_grads": [moved(ident) if ident else 0 for ident in record.param_grads]})


def _argument_names(code: str) -> list[str]:
    from planner.profiler.inductor_buffers import _ARGS, call_body

    for statement in call_body(code):
        if match := _ARGS.match(statement):
            return [n.strip() for n in match.group(1).split(",") if n.strip()]
    return []


def _argument_keys(code: str, result) -> dict[str, int]:
    """Each argument's storage key in `result` (run_call numbers the arguments first, in order)."""
    return {name: key for key, name in enumerate(_argument_names(code))}


def degrees(a: AllocRecord, scale_a: Fraction, b: AllocRecord, scale_b: Fraction) -> list[int]:
    """Each allocation's power of the scale (forward's, then backward's), from two readings of one block; ValueError
    where the two are not the same program or a size does not scale by a whole power."""
    if _frees(a) != _frees(b) or (a.output, a.input_grad, a.param_grads) != (b.output, b.input_grad, b.param_grads):
        raise ValueError("the two readings are not the same program: their wrappers free in another order")
    ratio = Fraction(scale_b) / Fraction(scale_a)
    found = []
    for size_a, size_b in zip(_sizes(a), _sizes(b), strict=True):
        d = round(math.log(size_b / size_a) / math.log(ratio)) if size_a and size_b else 0
        if Fraction(size_a) * ratio ** d != size_b:
            raise ValueError(f"a buffer of {size_a:,} B at the first reading is {size_b:,} B at the second: "
                             f"not a whole power of {ratio}")
        found.append(d)
    return found


def scaled(a: AllocRecord, scale_a: Fraction, powers: list[int], target: Fraction = Fraction(1)) -> AllocRecord:
    """Reading `a` (at `scale_a` of the target's widths and tokens) at the target: each allocation times
    (target / scale_a) ** its power; ValueError where that is not a whole number of bytes."""
    factor = Fraction(target) / Fraction(scale_a)
    sizes = []
    for size, d in zip(_sizes(a), powers, strict=True):
        value = Fraction(size) * factor ** d
        if value.denominator != 1:
            raise ValueError(f"{size:,} B times {factor}^{d} is not whole")
        sizes.append(int(value))
    it = iter(sizes)
    forward = [next(it) if code > 0 else code for code in a.forward]
    backward = [next(it) if code > 0 else code for code in a.backward]
    return a.model_copy(update={"forward": forward, "backward": backward})


def flash_calls_law(a: list, scale_a: Fraction, b: list, scale_b: Fraction) -> None:
    """ValueError unless two readings' flash backward calls (block_record_calls') are the same calls at the same
    places, each query's batch and heads equal and its length and head dim in the ratio of the scales."""
    ratio = Fraction(scale_b) / Fraction(scale_a)
    if [at for at, _ in a] != [at for at, _ in b]:
        raise ValueError("the two readings' flash attention backward calls are not at the same places")
    for (_, (batch, heads, length, dim)), (_, (batch_b, heads_b, length_b, dim_b)) in zip(a, b, strict=True):
        if (batch, heads) != (batch_b, heads_b) or length * ratio != length_b or dim * ratio != dim_b:
            raise ValueError(f"a flash backward's query {(batch, heads, length, dim)} at the first reading is "
                             f"{(batch_b, heads_b, length_b, dim_b)} at the second: not the same call scaled")


def _sizes(record: AllocRecord) -> list[int]:
    return [code for code in (*record.forward, *record.backward) if code > 0]


def _frees(record: AllocRecord) -> tuple:
    return tuple(code if code < 0 else 0 for code in (*record.forward, *record.backward))
