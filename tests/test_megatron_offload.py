"""Megatron-LM's --cpu-offloading / --cpu-offloading-num-layers (megatron-core 92c8482e, Transformer Engine v2.9's
offload handler; docs/framework-facts.md §107) read as ckplan's offload option on the first N decoder layers,
and refused where megatron-core refuses it."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.cli import run

from planner.commands.evaluate_config import predict
from planner.errors import UserError
from planner.models.configs import megatron

BRIDGE = Path(__file__).resolve().parent.parent / "configs" / "megatron-bridge"
TINY = ["--num-layers: 4", "--hidden-size: 256", "--num-attention-heads: 8", "--seq-length: 128",
        "--vocab-size: 1024", "--bf16: true", "--micro-batch-size: 2", "--global-batch-size: 2"]


def _write(tmp_path, *extra: str) -> Path:
    path = tmp_path / "args.yaml"
    path.write_text("MODEL_ARGS:\n" + "".join(f"  {line}\n" for line in [*TINY, *extra]))
    return path


def _status(job) -> dict[str, str]:
    return {s.name: s.status for s in job.settings}


def test_the_70b_gb200_recipe_offloads_its_first_40_layers():
    job = megatron.read(BRIDGE / "gb200_70b_fp8cs.yaml")
    assert (job.recompute.mode, job.recompute.num_layers, job.recompute.option) == ("block", 40, "offload")
    assert _status(job)["--cpu-offloading"] == _status(job)["--cpu-offloading-num-layers"] == "modelled"


def test_a_count_alone_turns_it_on_and_off_alone_offloads_nothing(tmp_path):
    # arguments.py 1250-1251 (92c8482e): --cpu-offloading-num-layers > 0 sets cpu_offloading
    job = megatron.read(_write(tmp_path, "--cpu-offloading-num-layers: 2"))
    assert (job.recompute.mode, job.recompute.num_layers, job.recompute.option) == ("block", 2, "offload")
    job = megatron.read(_write(tmp_path, "--cpu-offloading: false"))
    assert job.recompute.mode == "none" and _status(job)["--cpu-offloading"] == "modelled"


@pytest.mark.parametrize("extra, message", [
    (["--cpu-offloading-num-layers: 4"], "fewer layers than the model's 4"),  # TransformerConfig: N < num_layers
    (["--cpu-offloading: true"], "no layer to offload"),  # TE's handler: an empty window map
    (["--cpu-offloading-num-layers: 2", "--pipeline-model-parallel-size: 2"], "pipeline parallelism"),
    (["--cpu-offloading-num-layers: 2", "--recompute-activations: true"], "recomputation"),
    (["--cpu-offloading-num-layers: 2", "--recompute-granularity: full", "--recompute-method: block",
      "--recompute-num-layers: 1"], "recomputation"),
    (["--cpu-offloading-num-layers: 2", "--cuda-graph-impl: local"], "CUDA graphs"),
])
def test_what_megatron_core_refuses_is_refused(tmp_path, extra, message):
    with pytest.raises(UserError, match=message):
        megatron.read(_write(tmp_path, *extra))


def test_cuda_graphs_off_are_no_refusal(tmp_path):
    job = megatron.read(_write(tmp_path, "--cpu-offloading-num-layers: 1", "--cuda-graph-impl: none"))
    assert job.recompute.num_layers == 1


def test_the_first_layers_offload_their_activations_to_the_host(tmp_path):
    offloaded = predict(megatron.read(_write(tmp_path, "--cpu-offloading-num-layers: 2")), gpus=1, gpu_name="gb200")
    plain = predict(megatron.read(_write(tmp_path)), gpus=1, gpu_name="gb200")
    stage = offloaded.stages[0]
    decoder = [name for name in stage.layers if name in plain.stages[0].layers and name.startswith("layers.")]
    assert len(decoder) == 4
    assert {n: stage.option(n) for n in decoder} == dict(zip(decoder, ["offload", "offload", "none", "none"]))
    # the host holds the two layers' whole saved sets, their inputs too (Transformer Engine's handler moves what
    # its modules mark, the input among them: planner/cost/te_offload.py), one microbatch in flight (one stage):
    # what ckplan's per-layer option moves plus the input it keeps
    options = {layer.name: {o.name: o for o in layer.recompute_options} for layer in offloaded.profile.layers}
    moved = sum(options[n]["offload"].host_bytes + options[n]["offload"].kept_bytes for n in decoder[:2])
    assert moved > 0
    assert offloaded.cost.stages[0].host_bytes == moved
    assert plain.cost.stages[0].host_bytes == 0
    assert offloaded.cost.stages[0].peak_bytes < plain.cost.stages[0].peak_bytes
    assert offloaded.cost.iteration_ms >= plain.cost.iteration_ms  # the copies add what they cannot hide


def test_the_cli_refuses_in_one_sentence(tmp_path):
    path = _write(tmp_path, "--cpu-offloading-num-layers: 2", "--pipeline-model-parallel-size: 2")
    result = run("evaluate", "--from-megatron", path, "--gpus", 2, "--gpu", "gb200")
    assert result.exit_code != 0
    assert "Traceback" not in result.output and "megatron-core refuses CPU offloading" in result.output


def test_the_fused_swiglu_takes_its_silu_output_off_what_offload_moves_not_off_what_it_keeps():
    """te_kept: the fused SwiGLU keeps no SiLU output (tokens x f x 2 B); an offloaded block keeps its input
    alone (tokens x h x 2 B) and moves the rest, so the SiLU output comes off its host bytes. It came off its
    kept bytes, which went below zero: the 70B GB200 recipe's offloaded blocks kept -640 MiB each."""
    from types import SimpleNamespace

    from test_bridge_memory import TINY as ARCH
    from test_bridge_memory import profile

    from planner.cost import te_kept

    eager = profile()
    fused = te_kept.fused_swiglu_profile(eager, SimpleNamespace(fused_swiglu_saves_input_only=True))
    tokens = 2 * 32  # micro-batch 2 x 32 tokens
    silu, block_input = tokens * ARCH.intermediate_size * 2, tokens * ARCH.hidden_size * 2
    for before, after in zip(eager.layers, fused.layers):
        if before.kind != "decoder_block":
            continue
        was = {o.name: o for o in before.recompute_options}["offload"]
        now = {o.name: o for o in after.recompute_options}["offload"]
        assert now.kept_bytes == was.kept_bytes == block_input
        assert was.host_bytes - now.host_bytes == was.recompute_peak_bytes - now.recompute_peak_bytes == silu
        none = {o.name: o for o in after.recompute_options}["none"]
        assert now.kept_bytes + now.host_bytes == none.kept_bytes  # what none keeps: the input here, the rest there


def test_a_search_compared_with_the_file_says_its_offload_is_scored_as_recompute():
    from planner.commands.search_compare import from_framework_job

    job = megatron.read(BRIDGE / "gb200_70b_fp8cs.yaml")
    record = from_framework_job(job, arch=job.arch, gpu="gb200", seq_len=8192)
    assert (record.recompute, record.ckpt_per_stage) == ("full", (40,))
    assert "offload of the first 40 layers (scored as whole-layer recompute)" in record.not_expressible
