"""What a block keeps for backward under torch.compile, read off AOTAutograd's partition.

torch.compile (inductor) traces a module's forward and backward into one joint graph and splits it
with `min_cut_rematerialization_partition` (torch/_inductor/compile_fx.py picks it for inductor;
torch/_functorch/partitioners.py 3725, torch 2.13.0 cf30153c): the forward graph's outputs beyond
the module's own are the tensors saved for backward, and cheap pointwise ops (RMSNorm's scaling,
SiLU, the rotary product) are recomputed in the backward instead of saved. The partition runs on
the traced graph, before any device code, so it is run here under FakeTensorMode: a full-size
block costs no memory.

Activation checkpointing under compile is tags on the joint graph's forward nodes, which the
partitioner obeys (partitioners.py 166-180 must_recompute, 2050-2103 cleanup_recompute_tags):
dynamo traces `torch.utils.checkpoint` into the tag_activation_checkpoint higher-order op and tags
every op in the region PREFER_RECOMPUTE (whole-block checkpoint), or with what a selective
checkpoint's policy returns per op (torch/_dynamo/variables/higher_order_ops.py, torch 2.13). Here
`aot_function` traces without dynamo, and `_tagged_partition` sets the same tags (ac_graph_id 1)
before calling the partitioner.

Device: on CPU `F.scaled_dot_product_attention` runs `_scaled_dot_product_flash_attention_for_cpu`
where CUDA runs `_scaled_dot_product_flash_attention`; both save q, k, v, the output and the fp32
logsumexp (their meta kernels: torch/_meta_registrations.py 6107-6145, 6376-6400), so the saved set
is the same. torchtitan's op-level policy names the CUDA op; the CPU one stands in for it here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import fx

POLICIES = ("none", "op-sac", "full")


@dataclass(frozen=True)
class Partition:
    """What one compiled module keeps: the saved activation bytes (weights and other inputs that
    are not activations left out), the names of the saved tensors, and the backward graph's
    peak beyond them (every op's output live from its definition to its last use, before
    inductor's fusion, which only removes intermediates: an upper bound)."""

    saved_bytes: int
    saved: tuple[str, ...]
    backward_extra_bytes: int


# ---------------------------------------------------------------- torchtitan's LLaMA block


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """torchtitan/models/norms.py RMSNorm at 9dec370: the norm in fp32, cast back, scaled."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight


def rotary(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """torchtitan/models/llama/model.py apply_rotary_emb at 9dec370 (complex product, fp32)."""
    x_ = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_ * freqs_cis).flatten(3).type_as(x)


def llama_block(x, freqs_cis, attention_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3, *, heads: int, kv_heads: int):
    """torchtitan's TransformerBlock (torchtitan/models/llama/model.py at 9dec370): attention with
    grouped K/V repeated to every head (repeat_kv) and causal SDPA, then the SwiGLU
    w2(silu(w1(x)) * w3(x)); both behind RMSNorm with a residual add. The linears' mm order
    (wq, wk, wv, wo, w1, w3, w2) is what torchtitan's op-level policy counts."""
    batch, seq, hidden = x.shape
    head_dim = hidden // heads
    y = rms_norm(x, attention_norm)
    q = F.linear(y, wq).view(batch, seq, heads, head_dim)
    k = F.linear(y, wk).view(batch, seq, kv_heads, head_dim)
    v = F.linear(y, wv).view(batch, seq, kv_heads, head_dim)
    q, k = rotary(q, freqs_cis), rotary(k, freqs_cis)
    rep = heads // kv_heads
    k = k[:, :, :, None, :].expand(batch, seq, kv_heads, rep, head_dim).reshape(batch, seq, heads, head_dim)
    v = v[:, :, :, None, :].expand(batch, seq, kv_heads, rep, head_dim).reshape(batch, seq, heads, head_dim)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    h = x + F.linear(out.transpose(1, 2).contiguous().view(batch, seq, hidden), wo)
    z = rms_norm(h, ffn_norm)
    return h + F.linear(F.silu(F.linear(z, w1)) * F.linear(z, w3), w2)


def llama_block_inputs(*, batch: int, seq: int, hidden: int, heads: int, kv_heads: int, ffn: int,
                       dtype=torch.bfloat16) -> list[torch.Tensor]:
    """The block's input (activation, index 0), its rotary table (a model buffer) and its weights
    in llama_block's order, random (call under FakeTensorMode for full sizes)."""
    head_dim = hidden // heads
    x = torch.randn(batch, seq, hidden, dtype=dtype, requires_grad=True)
    freqs = torch.randn(1, seq, 1, head_dim // 2, dtype=torch.complex64)
    shapes = [(hidden,), (hidden, hidden), (kv_heads * head_dim, hidden), (kv_heads * head_dim, hidden),
              (hidden, hidden), (hidden,), (ffn, hidden), (hidden, ffn), (ffn, hidden)]
    return [x, freqs, *(torch.randn(*shape, dtype=dtype, requires_grad=True) for shape in shapes)]


def partition_llama_block(*, batch: int, seq: int, hidden: int, heads: int, kv_heads: int, ffn: int,
                          policy: str) -> Partition:
    """A torchtitan LLaMA block of these sizes compiled under `policy` (POLICIES), partitioned
    under FakeTensorMode."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):  # the rng state sdpa is rerun with is a real tensor
        inputs = llama_block_inputs(batch=batch, seq=seq, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn)
        return partition(partial(llama_block, heads=heads, kv_heads=kv_heads), inputs,
                         policy=policy, activation_inputs=(0,))


# ---------------------------------------------------------------- a model file's layers


MODULE_POLICIES = ("none", "full")  # a model file's layer has no op-level policy of its own


def module_figures(module: torch.nn.Module, x: torch.Tensor) -> dict[str, int]:
    """Per policy (MODULE_POLICIES), what `module(x)` keeps for backward compiled: its parameters
    and buffers are inputs that are not activations. Call it under the FakeTensorMode the module's
    tensors belong to (a fake profile's)."""
    from torch.func import functional_call

    names = [name for name, _ in module.named_parameters()] + [name for name, _ in module.named_buffers()]
    tensors = [p for _, p in module.named_parameters()] + [b for _, b in module.named_buffers()]
    x = x.detach().requires_grad_(x.is_floating_point())

    def run(inputs, *weights):
        return functional_call(module, dict(zip(names, weights, strict=True)), (inputs,))

    return {policy: partition(run, [x, *tensors], policy=policy, activation_inputs=(0,)).saved_bytes
            for policy in MODULE_POLICIES}


# ---------------------------------------------------------------- the partition


def partition(fn: Callable, inputs: list[torch.Tensor], *, policy: str, activation_inputs: tuple[int, ...]) -> Partition:
    """Trace `fn(*inputs)` and its backward as torch.compile would (inductor's decompositions,
    the min-cut partitioner) under `policy`, and read what the forward saves. `activation_inputs`:
    the indices of the inputs that are activations (saved ones count); the rest are weights and
    buffers (saved ones do not)."""
    from torch._functorch.aot_autograd import aot_function, make_boxed_func
    from torch._inductor.decomposition import select_decomp_table

    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r} is not one of {POLICIES}")
    graphs: dict[str, fx.GraphModule] = {}

    def keep(name):
        def compiler(gm, _example_inputs):
            graphs[name] = gm
            return make_boxed_func(gm)
        return compiler

    traced = aot_function(fn, fw_compiler=keep("fw"), bw_compiler=keep("bw"),
                          partition_fn=partial(_tagged_partition, policy=policy),
                          decompositions=select_decomp_table())
    out = traced(*inputs)
    out.sum().backward()
    return _read(graphs["fw"], graphs["bw"], num_outputs=1, activation_inputs=activation_inputs)


def _tagged_partition(joint: fx.GraphModule, joint_inputs, *, policy: str, num_fwd_outputs: int, **kwargs):
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    if policy != "none":
        _tag(joint, policy, num_fwd_outputs)
    return min_cut_rematerialization_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)


# torchtitan's op-level policy's save list (9dec370 parallelize_llama.py 214-260; b5bcd76c
# torchtitan/distributed/activation_checkpoint.py): every second mm and the attention's op are saved.
_SAVED_ATTENTION = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention")


def _tag(joint: fx.GraphModule, policy: str, num_fwd_outputs: int) -> None:
    """Tag the joint graph's forward ops as dynamo tags a checkpointed region: PREFER_RECOMPUTE
    each (full), or MUST_SAVE where torchtitan's op-level policy saves the op (op-sac: its save
    list, of the mms only the odd-numbered in forward order), PREFER_RECOMPUTE elsewhere."""
    from torch.utils.checkpoint import CheckpointPolicy

    forward = _forward_nodes(joint, num_fwd_outputs)
    mm_count = 0
    for node in joint.graph.nodes:
        if node not in forward or node.op != "call_function":
            continue
        save = False
        if policy == "op-sac":
            name = getattr(node.target, "__name__", "").split(".")[0]
            if node.target is torch.ops.aten.mm.default:
                mm_count += 1
                save = mm_count % 2 == 1
            elif name in _SAVED_ATTENTION:
                save = True
            elif node.target.__name__ == "getitem" and node.args[0].meta.get("recompute") == CheckpointPolicy.MUST_SAVE:
                save = True
        node.meta["recompute"] = CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE
        node.meta["ac_graph_id"] = 1


def _forward_nodes(joint: fx.GraphModule, num_fwd_outputs: int) -> set[fx.Node]:
    """The nodes the forward's outputs depend on (the forward half of the joint graph)."""
    output = next(node for node in joint.graph.nodes if node.op == "output")
    found, stack = set(), [arg for arg in output.args[0][:num_fwd_outputs] if isinstance(arg, fx.Node)]
    while stack:
        node = stack.pop()
        if node not in found:
            found.add(node)
            stack.extend(node.all_input_nodes)
    return found


# ---------------------------------------------------------------- reading the graphs


def _storage(value) -> int | None:
    return value.untyped_storage()._cdata if isinstance(value, torch.Tensor) else None


def _is_rng_state(node: fx.Node) -> bool:
    """The generator state saved to rerun an op that may draw random numbers (sdpa under full
    recompute: run_and_save_rng_state; on CPU the generator's whole state, 5,056 B, on CUDA a seed
    and an offset): a constant per block, not an activation."""
    source = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    return source is not None and "rng_state" in str(source.target)


def _nbytes(value) -> int:
    """A storage's bytes as the profile counts them (a fake profile for a GPU: the caching
    allocator's 512-byte blocks, planner/profiler/storages.py)."""
    from planner.profiler.storages import counted_bytes

    return counted_bytes(value.untyped_storage().nbytes(), value.device) if isinstance(value, torch.Tensor) else 0


def _read(fw: fx.GraphModule, bw: fx.GraphModule, *, num_outputs: int, activation_inputs: tuple[int, ...]) -> Partition:
    placeholders = [node for node in fw.graph.nodes if node.op == "placeholder"]
    not_activations = {_storage(node.meta.get("val")) for index, node in enumerate(placeholders)
                       if index not in activation_inputs}
    output = next(node for node in fw.graph.nodes if node.op == "output")
    saved_nodes = [arg for arg in output.args[0][num_outputs:] if isinstance(arg, fx.Node)]
    counted: dict[int, int] = {}
    names = []
    for node in saved_nodes:
        value = node.meta.get("val")
        key = _storage(value)
        if key is None or key in not_activations or _is_rng_state(node):
            continue
        names.append(node.name)
        counted[key] = _nbytes(value)
    saved = sum(counted.values())
    return Partition(saved_bytes=saved, saved=tuple(names), backward_extra_bytes=_backward_extra(bw, set(counted)))


def _backward_extra(bw: fx.GraphModule, saved_storages: set[int]) -> int:
    """The backward graph's peak of live storages beyond the saved activations and the inputs:
    each op's output from its definition to its last use (the graph's outputs, the gradients,
    to the end). Weight gradients are left out, as the profiles' transients leave them
    (accumulated into the gradient buffers the static memory holds)."""
    nodes = list(bw.graph.nodes)
    last_use: dict[fx.Node, int] = {}
    for index, node in enumerate(nodes):
        for used in node.all_input_nodes:
            last_use[used] = index
    output = nodes[-1]
    grads = output.args[0]
    input_grad = grads[0] if grads and isinstance(grads[0], fx.Node) else None
    skipped = {node for node in grads if isinstance(node, fx.Node) and node is not input_grad}
    live: dict[int, int] = {}  # storage -> bytes
    owners: dict[int, set[fx.Node]] = {}
    peak = 0
    for index, node in enumerate(nodes):
        value = node.meta.get("val")
        key = _storage(value)
        if node.op == "call_function" and key is not None and key not in saved_storages and node not in skipped:
            live.setdefault(key, _nbytes(value))
            owners.setdefault(key, set()).add(node)
        if node.op == "placeholder" and key is not None and key not in saved_storages and "tangents" in node.name:
            live.setdefault(key, _nbytes(value))
            owners.setdefault(key, set()).add(node)
        peak = max(peak, sum(live.values()))
        for used in node.all_input_nodes:
            if last_use.get(used) == index and used is not input_grad:
                key = _storage(used.meta.get("val"))
                if key in owners:
                    owners[key].discard(used)
                    if not owners[key]:
                        live.pop(key, None)
                        del owners[key]
    return peak
