"""Mixture-of-experts models on the runtime: the profile's routing record, expert parallelism's
all-to-all dispatch against one process (bit for bit), and a dp 2 x ep 2 run against the
one-process reference."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import ROOT
from fixtures import moe_tiny
from fixtures.cli import run_ok
from fixtures.rt_plans import make_plan

from planner import io
from planner.cost import dataparallel
from planner.errors import UserError
from planner.runtime import run_plan
from planner.runtime.experts import expert_parallel, reduce_expert_grads
from planner.runtime.launcher import _free_port
from planner.runtime.reference import against_reference
from planner.runtime.routing import find_experts, layer_routing, rank_load
from planner.schema import TrainSetup

MOE_TINY = ROOT / "tests" / "fixtures" / "moe_tiny.py"
EP2 = TrainSetup(stages=1, microbatches=1, micro_batch_size=2, mem_caps_bytes=[2**30], dp=2, ep=2)
TOKENS, DIM = 16, 16  # one microbatch of the blocks below: 2 sequences of 8


def _bundled_block() -> torch.nn.Module:
    return moe_tiny.moe.MoE()


def _hf_block(family: str) -> torch.nn.Module:
    from transformers import AutoConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    fields = dict(hidden_size=DIM, intermediate_size=24, num_attention_heads=2, num_experts_per_tok=2)
    if family == "mixtral":
        config = AutoConfig.for_model("mixtral", num_local_experts=4, **fields)
        config._experts_implementation = "grouped_mm"  # what from_config picks; Qwen2-MoE's below runs the eager loop
        block = MixtralSparseMoeBlock(config)
    else:
        config = AutoConfig.for_model("qwen2_moe", num_experts=4, moe_intermediate_size=8,
                                      shared_expert_intermediate_size=12, **fields)
        config._experts_implementation = "eager"
        block = Qwen2MoeSparseMoeBlock(config)
    for param in block.parameters():  # transformers leaves its stacked experts uninitialised
        torch.nn.init.normal_(param, std=0.3)
    return block


BLOCKS = {"bundled": _bundled_block, "mixtral": lambda: _hf_block("mixtral"), "qwen2_moe": lambda: _hf_block("qwen2_moe")}


def test_the_experts_contract_finds_the_bundled_and_hugging_face_experts():
    for name, build in BLOCKS.items():
        found = find_experts(build())
        assert [fqn for fqn, _ in found] == ["experts"], name
        assert found[0][1].num_experts == 4


def test_routing_counts_every_token_copy_once():
    """Dropless top 2: 16 tokens make 32 copies, whatever the router's choice."""
    torch.manual_seed(0)
    block = _bundled_block()
    routing = layer_routing(block, torch.randn(2, 8, DIM))
    assert sum(routing.routed_tokens) == TOKENS * 2 and len(routing.routed_tokens) == 4
    assert routing.expert_param_count == 4 * (2 * 8 * DIM + DIM * 8)  # gate_up (E, 2w, D) and down (E, D, w)
    assert routing.a2a_bytes == TOKENS * 2 * DIM * 4  # every copy's fp32 hidden state
    assert layer_routing(torch.nn.Linear(DIM, DIM), torch.randn(2, DIM)) is None


def test_rank_load_is_the_busiest_ranks_share_of_the_copies():
    # 4 experts on 2 ranks: rank 0 holds experts 0 and 1 (8 + 12 of 32 copies), rank 1 the rest
    assert rank_load([8, 12, 4, 8], 4, 2) == 20 * 2 / 32
    assert rank_load([8, 8, 8, 8], 4, 4) == 1.0 and rank_load([8, 12, 4, 8], 4, 1) == 1.0
    # two modules of 4: rank 0 computes 8 + 12 + 4 + 4 copies, rank 1 4 + 8 + 8 + 16
    assert rank_load([8, 12, 4, 8, 4, 4, 8, 16], 4, 2) == 36 * 2 / 64


def test_expert_parallelism_refuses_zero():
    setup = TrainSetup.model_validate({**EP2.model_dump(), "zero": 1})
    with pytest.raises(UserError, match="ZeRO 0 only"):
        expert_parallel(_bundled_block(), setup, device_type="cpu")


def test_profile_records_the_routing(tmp_path):
    profile = tmp_path / "moe.json"
    run_ok("profile", MOE_TINY, "--micro-batch-size", "2", "--threads", "1", "--repeats", "1", "--warmup", "0",
           "--out", profile)
    layers = {layer.name: layer for layer in io.load_profile(profile).layers}
    experts = 4 * (2 * 8 * 16 + 16 * 8)
    for name in ("blocks.0", "blocks.1"):
        assert sum(layers[name].routed_tokens) == 2 * 8 * 2 and len(layers[name].routed_tokens) == 4
        assert layers[name].expert_param_count == experts and layers[name].a2a_bytes == 2 * 8 * 2 * 16 * 4
        # the experts' weight-gradient temporaries: part of the transient, as large as the experts
        assert 0 < layers[name].expert_transient_bytes <= layers[name].transient_bytes
        assert 0 < layers[name].expert_act_bytes < layers[name].act_bytes
    assert layers["embed"].routed_tokens == [] and layers["head"].expert_param_count == 0


# ---------------------------------------------------------------- two processes


def _one_process(block: torch.nn.Module, inputs: list[torch.Tensor], grads: list[torch.Tensor]):
    """Each rank's microbatch through the whole block in one process: outputs, input
    gradients, and the parameter gradients summed over both microbatches."""
    outputs, input_grads = [], []
    for x, grad in zip(inputs, grads, strict=True):
        x = x.clone().requires_grad_()
        out = block(x)
        out.backward(grad)
        outputs.append(out.detach())
        input_grads.append(x.grad)
    return outputs, input_grads, {name: param.grad.clone() for name, param in block.named_parameters()}


def _compare_block(name: str, rank: int) -> dict:
    torch.manual_seed(0)
    whole = BLOCKS[name]()
    split = copy.deepcopy(whole)
    generator = torch.Generator().manual_seed(1)
    inputs = [torch.randn(2, 8, DIM, generator=generator) for _ in range(2)]
    grads = [torch.randn(2, 8, DIM, generator=generator) for _ in range(2)]
    outputs, input_grads, param_grads = _one_process(whole, inputs, grads)
    expert_parallel(split, EP2, device_type="cpu")
    x = inputs[rank].clone().requires_grad_()
    out = split(x)
    out.backward(grads[rank])
    reduce_expert_grads(split)  # the whole group's tokens' gradient, / dp
    experts = dict(find_experts(split))["experts"]
    local = experts.num_experts
    wanted = {pname: param_grads[f"experts.{pname}"][rank * local:(rank + 1) * local] / 2 for pname, _ in
              experts.named_parameters()}
    expert_err = max(float((param.grad - wanted[pname]).abs().max() / wanted[pname].abs().max())
                     for pname, param in experts.named_parameters())  # relative: the sums' order differs
    return {"out": torch.equal(out, outputs[rank]), "input_grad": torch.equal(x.grad, input_grads[rank]),
            "out_err": float((out - outputs[rank]).abs().max() / outputs[rank].abs().max()),
            "input_grad_err": float((x.grad - input_grads[rank]).abs().max() / input_grads[rank].abs().max()),
            "local_experts": local, "expert_grad_err": expert_err,
            "held": [tuple(param.shape) for param in experts.parameters()]}


def _dispatch_worker(rank: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        queue.put((rank, {name: _compare_block(name, rank) for name in BLOCKS}))
    except BaseException as exc:
        queue.put((rank, repr(exc)))
        raise
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_all_to_all_dispatch_equals_one_process_bit_for_bit():
    """ep 2 over 2 gloo processes, each with its own microbatch: each rank's output is the whole
    block's in one process bit for bit (the bundled model's, and transformers' Qwen2-MoE block on
    its eager experts loop), its input gradient too for the bundled block (the Qwen2-MoE loop sums
    its experts' input gradients in another order). transformers' Mixtral block on its default
    grouped_mm agrees to float rounding: torch._grouped_mm's CPU kernel rounds a row differently
    with its group's size, and an expert's group holds both ranks' tokens. Each rank holds 2 of the
    4 experts, and their gradient is the one process's over both microbatches, / dp."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    port = _free_port()
    procs = [context.Process(target=_dispatch_worker, args=(rank, port, queue)) for rank in range(2)]
    for proc in procs:
        proc.start()
    found = dict(queue.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
    for rank, results in found.items():
        assert isinstance(results, dict), results
        for name, result in results.items():
            assert result["out"] or name == "mixtral", (rank, name, result)
            assert result["input_grad"] or name != "bundled", (rank, name, result)
            assert result["out_err"] < 1e-6 and result["input_grad_err"] < 1e-6, (rank, name, result)
            assert result["local_experts"] == 2 and all(shape[0] == 2 for shape in result["held"]), (name, result)
            assert result["expert_grad_err"] < 1e-6, (rank, name, result)


@pytest.mark.slow
def test_dp2_ep2_trains_like_one_process_with_half_the_experts():
    """One stage on dp 2 with its experts split over ep 2, a MoE block checkpointed (its
    all-to-alls run again in the recompute): the losses of one process, and each rank holds
    the dense weights and half the experts' (weights, gradients, Adam's m and v)."""
    plan = make_plan(MOE_TINY, [["embed", "blocks.0", "blocks.1", "head"]], checkpointed=[["blocks.0"]],
                     microbatches=2)
    plan.setup = TrainSetup.model_validate({**plan.setup.model_dump(), "dp": 2, "ep": 2})
    report = run_plan(plan, plan_file=None, steps=1, warmup_steps=1)
    diffs = against_reference(plan, report, plan_file=None, seed=0)
    assert len(diffs) == 3 and all(diff.ok for diff in diffs), diffs
    model = moe_tiny.build_model()
    experts = sum(param.numel() for _, module in find_experts(model) for param in module.parameters())
    dense = sum(param.numel() for param in model.parameters()) - experts
    tensors = len(list(model.parameters()))
    static = (dense + experts // 2) * dataparallel.bytes_per_param(plan.setup) + 4 * tensors  # + Adam's step counts
    assert report.stages[0].measured.static_bytes == static


def test_solve_with_ep_states_the_routing_it_assumes():
    """--ep E plans balanced routing; the profile's own routing on the busiest rank, and what its
    experts would keep beyond the plan, are said (rank_load: 20 of 32 copies on one of 2 ranks)."""
    from planner.commands.expert_options import routing_note
    from planner.models.synthetic import layer, profile_of

    plain = profile_of([layer(f"l{i}", "Block", fwd_ms=1.0, act_mib=1, input_mib=1, param_count=10) for i in range(2)])
    assert routing_note(plain, 2) is None  # no routing recorded: nothing to say
    moe = layer("moe", "MoE", fwd_ms=1.0, act_mib=1, input_mib=1, param_count=10).model_copy(
        update={"routed_tokens": [8, 12, 4, 8], "expert_act_bytes": 4096})
    note = routing_note(profile_of([moe, layer("l1", "Block", fwd_ms=1.0, act_mib=1, input_mib=1, param_count=10)]), 2)
    assert "1.25x the mean" in note and "moe" in note and "1 KiB more per microbatch" in note
