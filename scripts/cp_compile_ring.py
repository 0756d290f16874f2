"""What torch.compile makes of torch's context-parallel ring in torchtitan 9dec370's step (issue 35, cpgrow).

torchtitan 9dec370 wraps each block in checkpoint_wrapper (full AC), compiles each one alone with
fullgraph=True, and runs every step inside get_train_context: sdpa_kernel([FLASH_ATTENTION,
EFFICIENT_ATTENTION]) and a fresh context_parallel(...) (which monkey-patches F.scaled_dot_product_attention
and shards the input, the labels and model.freqs_cis in place). This runs a small LLaMA-like block the same
way, one CPU process per CP rank over gloo, and prints per rank: dynamo's counters (graph breaks,
unique graphs), the collectives and attention calls in each AOT graph, and each graph's peak of the bytes it
allocates itself, in graph order, every tensor freed after its last use (views, getitem and wait_tensor
share their input's storage; the graph's inputs not counted).

The ring calls aten._scaled_dot_product_flash_attention (the CUDA op) and its backward; on CPU torch runs
_scaled_dot_product_flash_attention_for_cpu instead, which the ring does not handle, so the script registers
CPU kernels for the CUDA ops that call torch's own CPU flash kernels, and points F.scaled_dot_product_attention
at the CUDA op. Written for the torch 2.6.0 wheel (experimental/_attention.py as there):

    torchrun --nproc-per-node N scripts/cp_compile_ring.py [--no-cp] [--tokens T] [--steps S]

(docs/framework-facts.md §30, docs/published-runs.md §15.cpgrow)
"""
import argparse
import collections
import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS, KV_HEADS, HEAD_DIM, DIM, LAYERS = 4, 2, 16, 64, 3
_lib = torch.library.Library("aten", "IMPL")


def _flash_forward(q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, scale=scale)
    none = torch.empty(0, dtype=torch.long)
    return (out, lse.float().reshape(q.shape[:3]).contiguous(), none, none, q.size(2), k.size(2),
            torch.empty((), dtype=torch.long), torch.empty((), dtype=torch.long), torch.empty(0, dtype=q.dtype))


def _flash_backward(grad, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, dropout_p, is_causal, seed, offset, *,
                    scale=None):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, k, v, out, lse, dropout_p, is_causal, scale=scale)


_lib.impl("_scaled_dot_product_flash_attention", _flash_forward, "CPU")
_lib.impl("_scaled_dot_product_flash_attention_backward", _flash_backward, "CPU")


def scaled_dot_product_attention(q, k, v, is_causal=False):
    """F.scaled_dot_product_attention as it dispatches on H100 (the flash op), for CPU."""
    return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal)[0]


F.scaled_dot_product_attention = scaled_dot_product_attention


def storages(node, known):
    """The storages a graph node's outputs live in: its input's for views, getitem and wait_tensor; new else."""
    value = node.meta.get("val")
    values = value if isinstance(value, (list, tuple)) else [value]
    if str(node.target) == "<built-in function getitem>":
        parent = known.get(node.args[0], [])
        return [parent[node.args[1]]] if node.args[1] < len(parent) else [None], {}
    schema = getattr(node.target, "_schema", None)
    aliases = schema is not None and schema.returns and schema.returns[0].alias_info is not None
    if (aliases or "wait_tensor" in str(node.target)) and node.all_input_nodes:
        return [known[node.all_input_nodes[0]][0]] * len(values), {}
    made = {(node.name, i): v.untyped_storage().nbytes() for i, v in enumerate(values) if isinstance(v, torch.Tensor)}
    return [(node.name, i) if (node.name, i) in made else None for i in range(len(values))], made


def peak_bytes(gm) -> tuple[int, str]:
    """The graph's peak of the bytes it allocates, in graph order, and the node where it is reached."""
    nodes, known, size, last = list(gm.graph.nodes), {}, {}, {}
    for index, node in enumerate(nodes):
        if node.op == "placeholder":
            known[node] = [None]
            continue
        known[node], made = storages(node, known) if node.op != "output" else ([], {})
        size.update(made)
        last.update({sid: index for sid in made})
        for arg in node.all_input_nodes:
            for sid in known.get(arg, []):
                if sid is not None:
                    last[sid] = len(nodes) if node.op == "output" else max(last[sid], index)
    live = peak = 0
    where = ""
    for index, node in enumerate(nodes):
        live += sum(size[sid] for sid in known.get(node, []) if sid is not None and sid[0] == node.name)
        if live > peak:
            peak, where = live, f"{index}:{node.target}"
        live -= sum(size[sid] for sid, end in last.items() if end == index)
    return peak, where


graphs = []


def recorder(kind):
    def compile_graph(gm, example_inputs):
        ops = collections.Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        graphs.append((kind, ops, peak_bytes(gm)))
        return torch._functorch.aot_autograd.make_boxed_func(gm.forward)
    return compile_graph


def rotate(x, freqs):
    x_ = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_ * freqs[: x.shape[1]].view(1, x.shape[1], 1, -1)).flatten(3).type_as(x)


class Block(nn.Module):
    """Attention with K/V repeated to the query heads before SDPA (torchtitan 9dec370's repeat_kv), then an MLP."""

    def __init__(self):
        super().__init__()
        self.wq, self.wo = nn.Linear(DIM, HEADS * HEAD_DIM, bias=False), nn.Linear(HEADS * HEAD_DIM, DIM, bias=False)
        self.wk, self.wv = (nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False) for _ in range(2))
        self.w1, self.w2 = nn.Linear(DIM, 4 * DIM, bias=False), nn.Linear(4 * DIM, DIM, bias=False)
        self.norm1, self.norm2 = nn.RMSNorm(DIM), nn.RMSNorm(DIM)

    def forward(self, x, freqs):
        b, s, _ = x.shape
        h = self.norm1(x)
        q, k, v = (w(h).view(b, s, -1, HEAD_DIM) for w in (self.wq, self.wk, self.wv))
        q, k = rotate(q, freqs), rotate(k, freqs)
        k, v = (t[:, :, :, None, :].expand(b, s, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM).reshape(b, s, HEADS, HEAD_DIM)
                for t in (k, v))
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.wo(o.transpose(1, 2).contiguous().view(b, s, -1))
        return x + self.w2(F.silu(self.w1(self.norm2(x))))


class Model(nn.Module):
    def __init__(self, seq: int):
        super().__init__()
        self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        inverse = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
        angles = torch.outer(torch.arange(seq).float(), inverse)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles))

    def forward(self, x):
        for layer in self.layers.values():
            x = layer(x, self.freqs_cis)
        return x


def ring_ranks(tokens: int):
    """(rank, world, mesh, model): gloo ranks on one CP mesh and this file's model of `tokens` a rank,
    its layers in bf16 (the rotary table stays complex64, as torchtitan's); set the module's sizes first."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))
    torch.manual_seed(0)
    model = Model(tokens * world)
    model.layers.to(torch.bfloat16)
    return rank, world, mesh, model


def train_step(model, mesh, x, labels, *, cp: bool = True) -> None:
    """One step under 9dec370's utils.get_train_context: flash or efficient attention, a fresh
    context_parallel over the inputs and the rotary table (unless not `cp`)."""
    from torch.distributed.tensor.experimental import context_parallel

    with contextlib.ExitStack() as stack:
        stack.enter_context(sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]))
        if cp:
            stack.enter_context(context_parallel(mesh, buffers=[x, labels, model.freqs_cis],
                                                 buffer_seq_dims=[1, 1, 0], no_restore_buffers={x, labels}))
        F.mse_loss(model(x), labels).backward()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-cp", action="store_true", help="no context_parallel (the CP 1 rows)")
    parser.add_argument("--tokens", type=int, default=1024, help="tokens a rank")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    from torch.distributed.tensor.experimental._attention import set_rotate_method
    rank, world, mesh, model = ring_ranks(args.tokens)
    seq = args.tokens * world
    backend = aot_autograd(fw_compiler=recorder("forward"), bw_compiler=recorder("backward"))
    for name, block in list(model.layers.named_children()):  # 9dec370's apply_ac, then apply_compile
        block = torch.compile(checkpoint_wrapper(block, preserve_rng_state=False), fullgraph=True, backend=backend)
        model.layers.register_module(name, block)
    set_rotate_method("allgather")  # 9dec370's default (config_manager.py)
    for _ in range(args.steps):
        x, labels = (torch.randn(1, seq, DIM, dtype=torch.bfloat16) for _ in range(2))
        train_step(model, mesh, x, labels, cp=not args.no_cp)
    shown = ("c10d", "flash", "run_with_rng", "run_and_save")
    for r in range(world):
        if r == rank and r in (0, world - 1):
            print(f"rank {rank} of {world}, torch {torch.__version__} ({torch.version.git_version[:8]}), "
                  f"{args.tokens} tokens a rank; dynamo: {dict(counters['stats'])}, graph breaks "
                  f"{sum(counters['graph_break'].values())}")
            for kind, ops, (peak, where) in graphs:
                calls = {k: v for k, v in sorted(ops.items()) if any(t in k for t in shown)}
                print(f"  {kind}: peak {peak} B at {where}; {calls}")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
