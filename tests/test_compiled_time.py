"""torch.compile's time from the compiler's own decisions: inductor's fused kernels' bytes
(planner/profiler/compiled_time.py), the profile's compiled passes, and --compile timing them."""

import dataclasses
import json

import pytest
from click.testing import CliRunner
from fixtures.tiny_compiled import TINY, evaluate_hand, tiny_profile

from planner.models import archs
from planner.profiler import analytic, analytic_time, compiled_time
from planner.profiler.analytic import Shape
from planner.profiler.membound import membound_ms
from planner.profiler.roofline import Work, roofline_ms

TOKENS, H = 16, 64


def test_inductor_fuses_rmsnorm_into_one_kernel_each_way_that_reads_each_input_once():
    import torch

    from planner.profiler.compiled import rms_norm

    x = torch.randn(TOKENS, H, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(H, dtype=torch.bfloat16, requires_grad=True)
    forward, backward = compiled_time.compile_and_read(rms_norm, [x, weight])
    # forward, one kernel: x (bf16) and the weight read; the output (bf16) and 1/rms per token
    # (fp32, saved for backward) written. Eager runs seven kernels (analytic_time: 36 B an element)
    assert [kernel.num_bytes for kernel in forward] == [2 * TOKENS * H + 2 * H + 4 * TOKENS + 2 * TOKENS * H]
    # backward, two reductions over different axes: the weight's gradient (over tokens: reads the
    # output's gradient, x and 1/rms, writes h bf16) and the input's (over hidden: reads the same and
    # the weight, writes the input's gradient)
    grads = 2 * TOKENS * H + 2 * TOKENS * H + 4 * TOKENS
    assert sorted(kernel.num_bytes for kernel in backward) == sorted([grads + 2 * H, grads + 2 * H + 2 * TOKENS * H])
    assert all(kernel.memory_bound for kernel in forward + backward)


def test_matmuls_attention_and_views_are_not_counted_as_memory_bound():
    def extern(op, reads=None):
        return compiled_time.KernelBytes("op1", "ExternKernelSchedulerNode", op, reads or {"buf0": 64}, {"buf1": 64})

    assert not extern("aten.mm.out").memory_bound
    assert not extern("aten._scaled_dot_product_flash_attention.default").memory_bound
    assert not extern("aten.view_as_complex.default").memory_bound
    assert extern("aten.mul.Tensor").memory_bound  # the complex rotary product inductor falls back on
    assert compiled_time.memory_bound_bytes([extern("aten.mm.out"), extern("aten.mul.Tensor")]) == 128


class _Extern:
    """An extern kernel's IR node: torch 2.13 names its aten op; torch 2.6's extern mm names only the
    wrapper's function."""

    def __init__(self, op_overload, python_kernel_name):
        self.op_overload, self.python_kernel_name = op_overload, python_kernel_name


class _Node26:
    """A scheduler node as torch 2.6.0 has it: only the summed estimate."""

    def __init__(self, inner, total):
        self.node, self._total = inner, total

    def get_name(self):
        return "op7"

    def get_read_write_buffers_sizes(self):
        return self._total


class _Node213(_Node26):
    """As torch 2.13 has it: the estimate per buffer."""

    def __init__(self, inner, accesses):
        super().__init__(inner, sum(n for _, n in accesses.values()))
        self._accesses = accesses

    def get_read_write_buffer_accesses(self, *, include_reads, include_writes):
        return {name: n for name, (kind, n) in self._accesses.items()
                if (kind == "r" and include_reads) or (kind == "w" and include_writes)}


# the scheduler node's class name is the kind read
Node26 = type("ExternKernelSchedulerNode", (_Node26,), {})
Node213 = type("ExternKernelSchedulerNode", (_Node213,), {})


def test_a_kernel_is_read_on_torch_2_13_per_buffer_and_on_2_6_as_its_summed_estimate():
    new = compiled_time._kernel(Node213(_Extern("aten.mul.Tensor", "aten.mul.Tensor"),
                                        {"buf0": ("r", 96), "buf1": ("r", 8), "buf2": ("w", 96)}))
    assert (new.reads, new.writes, new.num_bytes, new.memory_bound) == ({"buf0": 96, "buf1": 8}, {"buf2": 96}, 200, True)
    # torch 2.6.0: no per-buffer accesses, the same estimate summed; the extern mm named by its wrapper only
    old = compiled_time._kernel(Node26(_Extern(None, "extern_kernels.mm"), 200))
    assert (old.op, old.reads, old.writes, old.num_bytes) == ("aten.mm", {"all": 200}, {}, 200)
    assert not old.memory_bound
    mul = compiled_time._kernel(Node26(_Extern(None, "aten.mul.Tensor"), 200))
    assert mul.memory_bound and compiled_time.memory_bound_bytes([old, mul]) == 200


def _tiny():
    return TINY


def test_the_compiled_passes_are_eagers_kernels_with_the_compiled_bytes():
    arch, shape, gpu = _tiny(), Shape(seq_len=1024, micro_batch_size=8), archs.gpu("h100")
    passes = analytic_time.block_work(arch, shape)
    timed = compiled_time.compiled_time(arch, shape, gpu, passes, moe=False)
    fwd, bwd = compiled_time.compiled_block_bytes(arch, shape, moe=False)["none"]
    # inductor's kernels' bytes at the fused kernels' rate (Work.fused_bytes), the accumulation into .grad eager
    # (the elementwise class's rate, membound.OP_CLASSES)
    assert timed.fwd_ms == roofline_ms(Work(passes[0].flops, fwd, passes[0].kernels, fwd), gpu)
    accumulate = analytic_time.ACCUMULATE * analytic.block_params(arch, shape) * 2
    assert timed.bwd_ms == pytest.approx(roofline_ms(Work(passes[1].flops, bwd, passes[1].kernels, bwd), gpu)
                                         + membound_ms(accumulate, gpu, "eager", "elementwise"))
    # fusion moves fewer bytes than eager each way
    assert fwd < passes[0].bytes and bwd + accumulate < passes[1].bytes
    assert set(timed.recompute_ms) == {"full", "op-sac"} and all(ms > 0 for ms in timed.recompute_ms.values())
    # not checked against inductor, not recorded: tensor parallelism
    assert compiled_time.compiled_time(arch, Shape(seq_len=1024, micro_batch_size=8, tp=2, sp=True), gpu, passes,
                                       moe=False) is None
    # context parallelism is recorded (the block at the rank's tokens: tests/test_compiled_time_cp.py)
    assert compiled_time.compiled_time(arch, Shape(seq_len=1024, micro_batch_size=8, cp=2), gpu, passes,
                                       moe=False) is not None
    # one K/V head (multi-query): inductor moves more than the formula says (the module's docstring)
    assert compiled_time.compiled_block_bytes(dataclasses.replace(arch, num_kv_heads=1), shape, moe=False) == {}


def test_m12s_block_backward_on_the_mi300x_charges_the_grad_accumulation_at_its_eager_mean():
    """LLaMA 3 8B's compiled block at 8192 tokens on the MI300X (torchao's M12 run): the .grad accumulation
    (grad += new, 3 x 2 B a parameter) over 218,112,000 parameters (q, o 4096^2, k, v 4096 x 1024, three
    4096 x 14336 MLP weights, two norms) at the MI300X's elementwise fraction (0.746: Liger-Kernel's MI300X
    rows have none: BabelStream's Add, 3.956 of 5.3 TB/s); inductor's bytes at the fused fraction."""
    arch, shape, gpu = archs.arch("llama3-8b"), Shape(seq_len=8192, micro_batch_size=1), archs.gpu("mi300x")
    params = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert analytic.block_params(arch, shape) == params == 218_112_000
    passes = analytic_time.block_work(arch, shape)
    fwd, bwd = compiled_time.compiled_block_bytes(arch, shape, moe=False)["none"]
    kernels = roofline_ms(Work(passes[1].flops, 0, passes[1].kernels), gpu)
    timed = compiled_time.compiled_time(arch, shape, gpu, passes, moe=False)
    accumulate_ms = 3 * params * 2 / (5.3e12 * 0.746) * 1e3
    assert accumulate_ms == pytest.approx(0.3310, abs=1e-4)
    assert timed.bwd_ms == pytest.approx(kernels + bwd / (5.3e12 * 0.449) * 1e3 + accumulate_ms)


def _profile(tmp_path, *, compiled):
    return tiny_profile(tmp_path, compiled=compiled)


def _evaluate(path, *extra):
    hand, said = evaluate_hand(path, *extra)
    return hand["iteration_ms"], said


def test_compile_makes_the_iteration_faster_by_exactly_the_profiles_compiled_difference(tmp_path):
    profile, path = _profile(tmp_path, compiled=True)
    blocks = [layer for layer in profile.layers if layer.compiled_time is not None]
    assert [layer.name for layer in blocks] == ["layers.0", "layers.1"]
    eager, _ = _evaluate(path)
    compiled, said = _evaluate(path, "--compile")
    # one stage, one microbatch, no recompute: each block's forward and backward, eager less compiled
    saved = sum(b.fwd_ms + b.bwd_ms - b.compiled_time.fwd_ms - b.compiled_time.bwd_ms for b in blocks)
    assert eager - compiled == pytest.approx(saved, rel=1e-9) and saved > 0
    assert "2 of 4 layers are timed as compiled" in said


def test_compile_on_a_profile_without_compiled_times_says_it_times_them_as_eager(tmp_path):
    _, path = _profile(tmp_path, compiled=False)
    eager, _ = _evaluate(path)
    compiled, said = _evaluate(path, "--compile")
    assert eager == compiled
    assert "the profile recorded no layer's time under compile, so every layer is timed as eager" in said


def test_a_profile_made_before_the_compiled_times_loads():
    from planner.schema import LayerProfile

    layer = json.loads(analytic.block_layer(0, _tiny(), Shape(seq_len=128, micro_batch_size=1),
                                            archs.gpu("h100")).model_dump_json())
    del layer["compiled_time"]
    assert LayerProfile.model_validate(layer).compiled_time is None


def test_the_compiled_losss_bytes_are_inductors_count_of_its_kernels():
    import torch
    import torch.nn.functional as F

    def titan(pred, labels):  # torchtitan bbb1b616 train.py loss_fn
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

    pred = torch.randn(1, 64, 128, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 128, (1, 64))
    with compiled_time.inductor_kernels() as graphs:
        torch.compile(titan, backend="inductor", fullgraph=True)(pred, labels).backward()
    found = sum(compiled_time.memory_bound_bytes(kernels) for kernels in graphs)
    assert found == compiled_time.compiled_loss_bytes(64, 64 * 128 * 2) == 4 * 64 * 128 * 2 + 44 * 64 + 40


def test_profile_compiled_records_the_blocks_and_the_losss_compiled_times_and_says_where_it_cannot(tmp_path):
    from planner import io
    from planner.cli import cli

    out = tmp_path / "l8.json"
    made = CliRunner().invoke(cli, ["profile", "--arch", "llama3-8b", "--seq-len", "128", "--micro-batch-size", "1",
                                    "--compiled", "--out", str(out)])
    assert made.exit_code == 0, made.output
    profile = io.load_profile(out)
    assert [layer.compiled_time is not None for layer in profile.layers] == [False] + [True] * 32 + [False]
    # 128 tokens x 128,256 vocab of bf16 logits, four passes, and 44 B a token and 40 B of scalars
    logits = 128 * 128256 * 2
    h100 = archs.gpu("h100")  # the loss's fused kernels at the rate fused kernels reach (membound.py)
    assert profile.compiled_loss_ms == pytest.approx(
        (4 * logits + 44 * 128 + 40) / (3.35e12 * h100.membound_fused_efficiency) * 1e3, rel=1e-3)
    # --mfu times FLOPs alone: no compiled times, said
    mfu = CliRunner().invoke(cli, ["profile", "--arch", "llama3-8b", "--seq-len", "128", "--micro-batch-size", "1",
                                   "--mfu", "0.4", "--compiled", "--out", str(tmp_path / "mfu.json")])
    assert mfu.exit_code == 0 and "no block of llama3-8b got compiled times" in " ".join(mfu.output.split())
    assert io.load_profile(tmp_path / "mfu.json").compiled_loss_ms is None
