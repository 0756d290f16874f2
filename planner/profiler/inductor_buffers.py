"""The buffers inductor's generated code allocates, and what a compiled function keeps and peaks at.

torch.compile's inductor writes a Python wrapper per graph (`call(args)`) that allocates every
buffer with `empty_strided_<device>(size, stride, dtype)`, aliases with `reinterpret_tensor` or
`bufN = bufM  # reuse`, frees with `del`, and returns the graph's outputs: the forward's return
is the user's outputs, then the tensors AOTAutograd's partition saves for backward, which the
backward's wrapper takes first in its `args` (then the gradients of the outputs). Reading the
wrappers gives each buffer's live range without running on the device the code is for
(torch/_inductor/codegen/wrapper.py, torch 2.13.0 cf30153c: make_buffer_allocation,
make_buffer_free, codegen_reinterpret_view).

A fallback kernel's output (`bufN = torch.ops.<op>(...)`, or `bufM = bufN[i]` of its tuple, a collective's
output) has no `empty_strided`: its bytes are read from the `assert_size_stride(bufM, size, stride[, 'torch.ops...'])`
inductor writes after it (2.13 names the op, 2.6.0 does not; after a cat 2.6.0 writes none, and its bytes are
its views'), in the dtype of the op's first tensor argument where
the wrapper states it (a buffer it allocated, or `aten.view.dtype(..., torch.uint8)`: a collective's output and a
cat's are their input's dtype), else in the dtype the caller states (`fallback_dtype`; bf16 by default, what a bf16
block's attention gradients are). `run_call` also returns which buffers are live at the peak.

`compiled_loss` compiles a loss on CPU and returns its bytes in multiples of the bf16 logits.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

_DTYPE_BYTES = {"torch.float32": 4, "torch.float64": 8, "torch.bfloat16": 2, "torch.float16": 2,
                "torch.int64": 8, "torch.int32": 4, "torch.bool": 1, "torch.uint8": 1, "torch.int8": 1,
                "torch.float8_e4m3fn": 1, "torch.float8_e5m2": 1}
_ALLOC = re.compile(r"^(\w+) = empty_strided_\w+\((\(.*?\)), (\(.*?\)), (torch\.\w+)\)$")
_REINTERPRET = re.compile(r"^(\w+) = reinterpret_tensor\((\w+),")
_REUSE = re.compile(r"^(\w+) = (\w+)$")
_ARGS = re.compile(r"^([\w, ]+) = args$")
_RETURN = re.compile(r"^return \((.*)\)$")
_FALLBACK = re.compile(r"^(\w+) = torch\.ops\.[\w.]+\(")
_ITEM = re.compile(r"^(\w+) = (\w+)\[(\d+)\](?:\[\d+\])?$")  # a tuple's item, or an item of a list in it
_SHAPE = re.compile(r"^\w+ = \w+\.(size|stride)\(\)$|^\w+ = \w+_(size|stride)\[\d+\]$")  # symbolic sizes: no storage
# torch 2.13 names the op after the strides; torch 2.6.0 writes the size and stride alone
_ASSERTED = re.compile(r"^assert_size_stride\((\w+), (\(.*?\)), (\(.*?\))(?:, 'torch\.ops.*)?\)$")
_VIEW_DTYPE = re.compile(r"^aten\.view\.dtype\(.*?, (torch\.\w+)\)")
_RNG_SAVED = re.compile(r"^\w+ = torch\.ops\.higher_order\.run_and_save_rng_state\(")
_CAT = re.compile(r"^\w+ = torch\.ops\.aten\.cat\.default\(\[")
# the flash attention backward (CUDA's op, or the CPU op standing in for it in a CPU reading) and its first argument's
# view size, the gradient of its output: the query's [batch, heads, length, head dim]
_FLASH_BACKWARD = re.compile(r"^\w+ = torch\.ops\.aten\._scaled_dot_product_flash_attention(?:_for_cpu)?_backward"
                             r"\.default\(reinterpret_tensor\(\w+, \((\d+), (\d+), (\d+), (\d+)\)")
_VIEW_SIZE = re.compile(r"reinterpret_tensor\(\w+, (\(.*?\)), \(")
_FIRST_NAME = re.compile(r"^(?:reinterpret_tensor\()?(\w+)\b")


@dataclass(frozen=True)
class CallBytes:
    """One wrapper's call: the most bytes live at once (its inputs included, while they are
    referenced) and, per returned value, the bytes of its storage (0: None or an input's)."""

    peak_bytes: int
    returned: tuple[str, ...]
    returned_storages: tuple[int, ...]  # a storage id per returned name (-1: None)
    storage_bytes: dict[int, int]
    at_peak: tuple[tuple[str, int], ...] = ()  # (a name of each storage live at the peak, its bytes), largest first
    peak_statement: str = ""  # the statement after which the peak is reached
    # the call's storages made and released, in order: +key where a statement makes one, -key where its last name goes
    # (a `del`, or a name rebound); the storages of `inputs` are the arguments' (compiled_record reads these)
    events: tuple[int, ...] = ()
    inputs: frozenset[int] = frozenset()
    # each flash attention backward call: (the number of `events` before which it returns, its outputs made, its
    # query's [batch, heads, length, head dim]) -- the kernel's own workspace is no buffer of the wrapper's
    flash_backward: tuple[tuple[int, tuple[int, int, int, int]], ...] = ()


def _elements(size: str) -> int:
    sizes = ast.literal_eval(size)
    elements = 1
    for dim in sizes if isinstance(sizes, tuple) else (sizes,):
        elements *= dim
    return elements


def _storage_bytes(size: str, stride: str, dtype: str) -> int:
    sizes, strides = ast.literal_eval(size), ast.literal_eval(stride)
    sizes = sizes if isinstance(sizes, tuple) else (sizes,)
    strides = strides if isinstance(strides, tuple) else (strides,)
    if any(s == 0 for s in sizes):
        return 0
    elements = 1 + sum((s - 1) * st for s, st in zip(sizes, strides))
    return elements * _DTYPE_BYTES[dtype]


def call_body(code: str) -> list[str]:
    """The statements of the wrapper's `def call(self, args)` (or `def call(args)`)."""
    lines = code.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"\s*def call\((self, )?args\):", line))
    indent = len(lines[start + 1]) - len(lines[start + 1].lstrip())
    body = []
    for line in lines[start + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break
        body.append(line.strip())
    return [line for line in body if line]


def run_call(code: str, input_bytes: dict[str, int], input_storages: dict[str, int] | None = None, *,
             fallback_dtype: str = "torch.bfloat16", buffer_bytes: dict[str, int] | None = None,
             unallocated: frozenset[str] = frozenset()) -> CallBytes:
    """Replay the wrapper's allocations and frees. `input_bytes`: each argument's storage bytes
    (0 for one not counted); `input_storages`: a storage id per argument where two share one;
    `fallback_dtype`: the dtype of a fallback kernel's outputs (their bytes from inductor's assert);
    `buffer_bytes`: a fallback's output's bytes by name where inductor's IR states its layout
    (`ir_buffer_bytes`; 2.6.0 writes no assert after a tuple's items), used before any assert. `unallocated`: buffers
    counted 0 B (another device's lowering does not make them: compiled_record.cpu_layout_copies), also where the
    wrapper writes one into a dying buffer's storage (`# reuse`): that storage is released with its last other name."""
    names: dict[str, int] = {}  # name -> storage id
    storage_bytes: dict[int, int] = {}
    first = 1 + max((input_storages or {}).values(), default=-1)
    fresh = iter(range(first, first + (1 << 30)))  # ids not taken by the inputs' storages
    live_peak, at_peak, peak_statement = 0, (), ""
    pending: dict[int, str] = {}  # fallback outputs whose bytes the next assert gives -> their dtype
    dtypes: dict[int, str] = {}  # storage id -> dtype, for the buffers the wrapper allocates

    def live() -> int:
        return sum(storage_bytes[s] for s in set(names.values()))

    def composition() -> tuple[tuple[str, int], ...]:
        first_name = {}
        for name, key in names.items():
            first_name.setdefault(key, name)
        return tuple(sorted(((n, storage_bytes[k]) for k, n in first_name.items() if storage_bytes[k]),
                            key=lambda item: -item[1]))

    returned: tuple[str, ...] = ()
    events: list[int] = []
    flash_backward: list[tuple[int, tuple[int, int, int, int]]] = []
    alive: set[int] = set()
    input_keys: set[int] = set()
    body = call_body(code)
    items = _tuple_items(body)

    def make_item(part: str, match) -> None:
        """A tuple's item: its storage, made where the op that returns the tuple runs (`items`)."""
        key = next(fresh)
        dtype = _argument_dtype(part, names, dtypes) or fallback_dtype
        if dtypes.get(names.get(match.group(2), -1)) == "rng":
            # run_and_save_rng_state returns (the generator's state, the op's outputs): a uint8 ByteTensor
            # (torch/_prims/rng_prims.py, torch.get_rng_state / torch.cuda.get_rng_state)
            dtype = "torch.uint8" if match.group(3) == "0" else fallback_dtype
        names[match.group(1)] = key
        dtypes.setdefault(key, dtype)
        if match.group(1) in (buffer_bytes or {}):
            storage_bytes[key] = buffer_bytes[match.group(1)]
        else:
            storage_bytes[key] = 0
            pending[key] = dtype

    for statement in body:
        for part in (p.strip() for p in statement.split("#")[0].split(";")):
            if not part:
                continue
            if match := _ARGS.match(part):
                for name in (n.strip() for n in match.group(1).split(",") if n.strip()):
                    key = (input_storages or {}).get(name, next(fresh))
                    names[name] = key
                    input_keys.add(key)
                    storage_bytes.setdefault(key, input_bytes.get(name, 0))
            elif match := _ALLOC.match(part):
                key = next(fresh)
                names[match.group(1)] = key
                storage_bytes[key] = 0 if match.group(1) in unallocated else _storage_bytes(*match.group(2, 3, 4))
                dtypes[key] = match.group(4)
            elif _SHAPE.match(part):
                continue
            elif (match := _ITEM.match(part)) and match.group(1) in names:
                continue  # made with its tuple
            elif match := _ITEM.match(part):
                make_item(part, match)
            elif match := _FALLBACK.match(part):
                key = next(fresh)
                dtype = _argument_dtype(part, names, dtypes) or fallback_dtype
                if _RNG_SAVED.match(part):
                    dtypes[key] = "rng"
                names[match.group(1)] = key
                dtypes.setdefault(key, dtype)
                if match.group(1) in (buffer_bytes or {}):
                    storage_bytes[key] = buffer_bytes[match.group(1)]
                elif _CAT.match(part):  # 2.6.0 writes no assert after a cat: its elements are its views'
                    storage_bytes[key] = _DTYPE_BYTES[dtype] * sum(
                        _elements(size) for size in _VIEW_SIZE.findall(part))
                else:
                    storage_bytes[key] = 0
                    pending[key] = dtype
                for item_part, item in items.get(match.group(1), ()):
                    make_item(item_part, item)
            elif (match := _ASSERTED.match(part)) and names.get(match.group(1)) in pending:
                key = names[match.group(1)]
                storage_bytes[key] = _storage_bytes(match.group(2), match.group(3), pending.pop(key))
            elif (match := _REINTERPRET.match(part) or _REUSE.match(part)) and match.group(1) in unallocated:
                names[match.group(1)] = key = next(fresh)  # in a dying buffer's storage here, none of its own there:
                storage_bytes[key] = 0  # the storage goes with its last name (the `del` beside the reuse)
            elif match := _REINTERPRET.match(part):
                names[match.group(1)] = names[match.group(2)]
            elif part.startswith("del "):
                for name in part[4:].split(","):
                    names.pop(name.strip(), None)
            elif _RETURN.match(part):
                returned = tuple(_returned_name(value) for value in ast.parse(part).body[0].value.elts)
            elif match := _REUSE.match(part):
                names[match.group(1)] = key = names[match.group(2)]
                if key in pending and match.group(1) in (buffer_bytes or {}):
                    # a fallback returning one tensor: 2.6.0 writes its MultiOutput as `bufM = bufN`, no assert
                    # after it, and the IR states bufM's layout (AsyncTP's fused_scaled_matmul_reduce_scatter)
                    storage_bytes[key] = buffer_bytes[match.group(1)]
                    pending.pop(key)
            elif re.match(r"^\w+ = ", part) and "args" not in part:
                raise ValueError(f"a wrapper statement this reader does not know: {part!r}")
            now = set(names.values())
            events += [key for key in sorted(now - alive)] + [-key for key in sorted(alive - now)]
            alive = now
            if match := _FLASH_BACKWARD.match(part):
                flash_backward.append((len(events), tuple(int(v) for v in match.groups())))
            if live() > live_peak:
                live_peak, at_peak, peak_statement = live(), composition(), part
    storages = tuple(-1 if name == "None" else names[name] for name in returned)
    return CallBytes(peak_bytes=live_peak, returned=returned, returned_storages=storages, storage_bytes=storage_bytes,
                     at_peak=at_peak, peak_statement=peak_statement, events=tuple(events),
                     inputs=frozenset(input_keys), flash_backward=tuple(flash_backward))


def _tuple_items(body: list[str]) -> dict[str, list]:
    """Each fallback's tuple (`bufN = torch.ops...(...)`) with the items the wrapper takes out of it later (`bufM =
    bufN[i]`, `bufM = bufN[i][j]`), in order: the op makes them when it runs, before the statements between (a `del`
    of its inputs, another op's call: 2.6.0 writes a flash backward's items after the next call), so run_call makes
    their storages at the op's statement."""
    tuples: set[str] = set()
    found: dict[str, list] = {}
    for statement in body:
        for part in (p.strip() for p in statement.split("#")[0].split(";")):
            if (match := _FALLBACK.match(part)) and not _CAT.match(part):
                tuples.add(match.group(1))
            elif (match := _ITEM.match(part)) and match.group(2) in tuples:
                found.setdefault(match.group(2), []).append((part, match))
    return found


def _argument_dtype(part: str, names: dict[str, int], dtypes: dict[int, str]) -> str | None:
    """The dtype of a fallback call's first tensor argument (`bufM = bufN[i]`: the tuple's), where the wrapper
    states it; None where it does not (an input of the graph, a scalar)."""
    if match := _ITEM.match(part):
        return dtypes.get(names.get(match.group(2), -1))
    argument = part[part.index("(") + 1:].lstrip("[")
    if match := _VIEW_DTYPE.match(argument):
        return match.group(1)
    if match := _FIRST_NAME.match(argument):
        return dtypes.get(names.get(match.group(1), -1))
    return None


_LAYOUT = re.compile(r"^\s*(buf\d+)\.layout = \w*Layout\('[^']*', (torch\.\w+), size=\[([^\]]*)\], stride=\[([^\]]*)\]",
                     re.M)


def ir_buffer_bytes(ir_text: str) -> dict[str, int]:
    """Each buffer's bytes from inductor's IR dump (TORCH_COMPILE_DEBUG's ir_post_fusion.txt: `bufN.layout =
    FixedLayout('cpu', torch.bfloat16, size=[...], stride=[...])`); a symbolic size is left out."""
    sizes = {}
    for name, dtype, size, stride in _LAYOUT.findall(ir_text):
        if re.search(r"[a-z]", size + stride) or dtype not in _DTYPE_BYTES:
            continue
        sizes[name] = _storage_bytes(f"({size},)" if size.strip() else "()", f"({stride},)" if stride.strip() else "()",
                                     dtype)
    return sizes


def graph_input_bytes(fx_readable: str) -> dict[str, int]:
    """Each input's bytes from a graph's readable form (`def forward(self, name: "bf16[4, 8]", ...)`, what
    TORCH_COMPILE_DEBUG writes as fx_graph_readable.py); an input without a tensor annotation counts 0."""
    signature = re.search(r"def forward\(self, (.*?)\):", fx_readable, re.S).group(1)
    dtypes = {"bf16": 2, "f16": 2, "f32": 4, "f64": 8, "i64": 8, "i32": 4, "b8": 1, "u8": 1, "i8": 1,
              "f8e4m3fn": 1, "f8e5m2": 1}
    sizes = {}
    for match in re.finditer(r'(\w+): "(\w+)\[([\d, ]*)\]"', signature):
        elements = 1
        for dim in (int(d) for d in match.group(3).split(",") if d.strip()):
            elements *= dim
        sizes[match.group(1)] = elements * dtypes[match.group(2)]
    return sizes


def _returned_name(value: ast.expr) -> str:
    """A returned value's buffer: a name, a reinterpret_tensor of one, or None."""
    if isinstance(value, ast.Call):
        value = value.args[0]
    return value.id if isinstance(value, ast.Name) else "None"


@dataclass(frozen=True)
class LossBytes:
    """A compiled loss's bytes: the logits (bf16, the unit), what lives from its forward to its
    backward (the logits included where the forward saves them) and the most at once."""

    logits_bytes: int
    kept_bytes: int
    peak_bytes: int

    @property
    def kept_x(self) -> float:
        return self.kept_bytes / self.logits_bytes

    @property
    def peak_x(self) -> float:
        return self.peak_bytes / self.logits_bytes


def loss_bytes(forward_code: str, backward_code: str, *, logits_bytes: int, num_outputs: int = 1) -> LossBytes:
    """The region of a loss whose forward takes (logits, labels) as its first two arguments: the
    labels are the batch's targets, charged with the batch, not here. The backward takes the
    forward's saved tensors in order, then one gradient per output."""
    forward_args = _ARGS.match(next(s for s in call_body(forward_code) if _ARGS.match(s))).group(1)
    logits, labels = [n.strip() for n in forward_args.split(",")][:2]
    forward = run_call(forward_code, {logits: logits_bytes, labels: 0}, {logits: 0, labels: 1})
    saved = forward.returned_storages[num_outputs:]
    kept = sum(forward.storage_bytes[s] for s in set(saved) if s >= 0)
    backward_args = _ARGS.match(next(s for s in call_body(backward_code) if _ARGS.match(s))).group(1)
    names = [n.strip() for n in backward_args.split(",") if n.strip()]
    storages = {name: key for name, key in zip(names, saved)}
    sizes = {name: forward.storage_bytes[key] if key >= 0 else 0 for name, key in storages.items()}
    for name in names[len(saved):]:  # the outputs' gradients: the loss's is a scalar
        sizes[name] = 4
    backward = run_call(backward_code, sizes, storages)
    return LossBytes(logits_bytes=logits_bytes, kept_bytes=kept, peak_bytes=max(forward.peak_bytes, backward.peak_bytes))


def compiled_loss(loss_fn, *, tokens: int, vocab: int) -> tuple[LossBytes, list[str]]:
    """Compile `loss_fn(pred, labels)` with inductor on CPU over bf16 logits of (1, tokens, vocab),
    run its forward and backward once, and read its two wrappers. Returns the bytes and the
    generated code (forward, backward)."""
    import torch
    from torch._inductor.utils import run_and_get_code

    pred = torch.randn(1, tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (1, tokens))
    compiled = torch.compile(loss_fn, backend="inductor", fullgraph=True)

    def step():
        compiled(pred, labels).backward()

    torch._dynamo.reset()
    _, codes = run_and_get_code(step)
    if len(codes) != 2:
        raise ValueError(f"expected a forward and a backward wrapper, got {len(codes)}")
    return loss_bytes(codes[0], codes[1], logits_bytes=tokens * vocab * 2), codes
