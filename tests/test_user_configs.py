"""Configs users have today, as their projects ship them (configs/, docs/published-runs.md §19.userconfigs):
what running ckplan on them broke, each fixed and pinned here."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.cli import run, run_ok

from planner.errors import UserError
from planner.models.configs import megatron, megatron_files

SHIPPED = Path(__file__).parents[1] / "configs" / "megatron-lm"  # the configs users are pointed to, read from there
BASE = """--num-layers: 8
--hidden-size: 256
--num-attention-heads: 8
--seq-length: 128
--vocab-size: 1024
--swiglu: true
--bf16: true"""
MOE = BASE + "\n--num-experts: 8\n--moe-router-topk: 2\n--moe-ffn-hidden-size: 256"


def _job(tmp_path, flags: str):
    path = tmp_path / "args.yaml"
    path.write_text("MODEL_ARGS:\n" + "".join(f"  {line}\n" for line in flags.strip().splitlines()))
    return megatron.read(path)


def test_a_layout_sets_the_virtual_pipeline_size(tmp_path):
    """arguments.py 941-951 (d98e8a64): the layout's stages / PP is the virtual pipeline size."""
    job = _job(tmp_path, BASE + '\n--pipeline-model-parallel-size: 2\n--pipeline-model-parallel-layout: "Et|tt|tt|t|t|tL"')
    assert (job.chunks, job.schedule, job.layers_per_stage) == (3, "interleaved-1F1B", [1, 2, 2, 1, 1, 1])
    with pytest.raises(UserError, match="5 stages, not a multiple of --pipeline-model-parallel-size 2"):
        _job(tmp_path, BASE + '\n--pipeline-model-parallel-size: 2\n--pipeline-model-parallel-layout: "Ett|tt|tt|t|tL"')


def test_a_bracketed_value_is_its_words_as_the_functional_tests_pass_it():
    pairs = dict(megatron_files.yaml_pairs('--recompute-modules: "[layernorm moe_act]"\n--num-layers: 4', "t.yaml"))
    assert pairs == {"--recompute-modules": ["layernorm", "moe_act"], "--num-layers": ["4"]}


def test_megatrons_expert_folding_is_refused_with_its_reason(tmp_path):
    """ETP 1 < TP 2: Megatron-LM takes EP 4 from TP x DP on 8 GPUs (parallel_state.py 874-883); ckplan
    places EP among the data-parallel ranks only."""
    from planner.commands.evaluate_config import predict

    flags = MOE + ("\n--tensor-model-parallel-size: 2\n--pipeline-model-parallel-size: 2\n"
                   "--expert-model-parallel-size: 4\n--expert-tensor-parallel-size: 1\n--global-batch-size: 8")
    job = _job(tmp_path, flags)
    with pytest.raises(UserError, match="takes its 4 expert-parallel ranks from TP x CP x DP"):
        predict(job, gpus=8, gpu_name="h100")
    with pytest.raises(UserError, match="a multiple of TP 2 x PP 2 x EP 4 = 16") as refused:
        predict(job, gpus=4, gpu_name="h100")  # ETP x EP x PP = 8 does not divide 4: Megatron refuses it too
    assert "TP x CP x DP" not in str(refused.value)


def test_nemo_overrides_are_refused_not_read_as_flags():
    """The gpt-nemo functional tests' MODEL_ARGS are NeMo's (trainer.devices ...), not Megatron-LM's flags."""
    result = run("evaluate", "--from-megatron", SHIPPED / "llama3-nemo_8b_mr_mbs4_gbs64_mcore_te_tp1_pp1_cp2_dgx_a100_1N8G.yaml", "--gpus", 8)
    assert result.exit_code != 0
    assert "gives NeMo's overrides (trainer.num_nodes, trainer.devices, trainer.max_steps, ...)" in result.output


def test_the_shipped_moe_layout_test_is_scored_per_virtual_stage():
    """Megatron-LM d98e8a64's moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading: its layout
    'Et*3|(tt|)*6mL' is 8 stages on PP 2 (4 virtual a rank, the last holding only MTP and the loss), its
    --recompute-modules "[layernorm mla_up_proj mlp moe_act]" four modules; scored (at 16 GPUs, where ETP
    = TP places EP 4 among 4 data-parallel ranks) without --overlap-grad-reduce, whose description once
    formatted None."""
    result = run_ok("evaluate", "--from-megatron", SHIPPED / "gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading.yaml", "--gpus", 16,
                    "--gpu", "h100", "--json")
    import json

    report = json.loads(result.output)
    assert (report["pp"], report["virtual_stages"], report["schedule"], report["ep"]) == (2, 4, "interleaved-1F1B", 4)
    # stages 0, 2, 4, 6 on rank 0 (E + 3 layers, then 2, 2, 2), 1, 3, 5, 7 on rank 1 (2, 2, 2, then m L: the MTP
    # layer's two, mtp.0 and mtp.0.head, and the head, since branch dsv3rows)
    assert [len(rank["layers"]) for rank in report["ranks"]] == [10, 9]
    assert report["ranks"][1]["layers"][-3:] == ["mtp.0", "mtp.0.head", "output"]
    assert report["ranks"][1]["layers"][-1] == "output"


def test_fp8_on_experts_is_scored_as_te_runs_it_and_on_latent_attention_in_bf16(tmp_path):
    """Megatron-LM d98e8a64's moe/deepseek_proxy_fsdp_ep2_fsdp2 asks FP8 (--fp8-format e4m3, tensorwise) of MoE
    blocks: a MoE block's Float8 record is TE's grouped GEMMs' (planner/profiler/te_moe_float8.py), so the FP8 is
    scored; with latent attention the profile records no Float8 timing: scored in bf16, the FP8 flags listed, not
    refused."""
    from planner.commands.evaluate_config import predict

    fp8 = "\n--fp8-format: e4m3\n--fp8-recipe: tensorwise\n--global-batch-size: 2"
    prediction = predict(_job(tmp_path, MOE + fp8), gpus=1, gpu_name="h100")
    status = {s.name: s.status for s in prediction.job.settings}
    assert status["--fp8-format"] == status["--fp8-recipe"] == "modelled" and prediction.setup.training.float8
    assert not any("scored in bf16" in note for note in prediction.notes)
    mla = "\n--multi-latent-attention: true\n--kv-lora-rank: 64\n--qk-head-dim: 32\n--qk-pos-emb-head-dim: 16\n--v-head-dim: 32"
    job = _job(tmp_path, MOE + mla + fp8)
    assert job.modelled.float8
    prediction = predict(job, gpus=1, gpu_name="h100")
    status = {s.name: s.status for s in prediction.job.settings}
    assert status["--fp8-format"] == status["--fp8-recipe"] == "not modelled" and not prediction.job.modelled.float8
    assert not prediction.setup.training.float8
    assert any("scored in bf16" in note for note in prediction.notes)


def test_yarns_rotary_flags_have_no_effect(tmp_path):
    job = _job(tmp_path, BASE + "\n--rotary-scaling-factor: 40\n--mscale: 1.0\n--mscale-all-dim: 1.0")
    assert {s.name: s.status for s in job.settings if s.name.startswith(("--rotary-s", "--mscale"))} == {
        "--rotary-scaling-factor": "no effect", "--mscale": "no effect", "--mscale-all-dim": "no effect"}


def test_a_megatron_script_is_compared_with_the_built_in_it_describes():
    """Megatron-LM d98e8a64's examples/mixtral/train_mixtral_8x7b_distributed.sh is Mixtral 8x7B: its reader
    leaves the rotary base unset (--rotary-base has no effect on the plan), which once made `search
    --from-megatron` call it another model than the built-in mixtral-8x7b (rope_theta 1e6)."""
    from planner.commands.search_compare import from_framework_job
    from planner.models import archs

    job = megatron.read(SHIPPED / "mixtral_8x7b_distributed.sh")
    record = from_framework_job(job, arch=archs.arch("mixtral-8x7b"), gpu="h100", seq_len=4096)
    assert (record.arch, record.tp, record.pp, record.ep, record.micro_batch_size) == ("mixtral-8x7b", 1, 4, 8, 1)
    # its --moe-aux-loss-coeff 1e-2 is a loss the job trains with, not the model: scored without it, and said
    assert job.arch.router_aux_loss and "the router's aux loss" in record.not_expressible
    with pytest.raises(UserError, match="describes another model than the one searched"):
        from_framework_job(job, arch=archs.arch("llama3-8b"), gpu="h100", seq_len=4096)


def test_megatrons_timing_level_is_read_and_modelled(tmp_path):
    """--timing-log-level 1 or 2 synchronizes the device at each timer's start and stop (megatron/core/timers.py
    130-155 at 2795ebde; level 2 around every microbatch's forward and backward, schedules.py 268, 382), which the
    A100 functional tests' configs set (docs/published-runs.md §37.newrows): read into the job and charged
    (planner/cost/hosttime.py timer_sync_ms), never "no effect"; a level Megatron-LM refuses, one sentence."""
    for level in (0, 1, 2):
        job = _job(tmp_path, BASE + f"\n--timing-log-level: {level}")
        status = {s.name: s.status for s in job.settings}
        assert (status["--timing-log-level"], job.modelled.timing_log_level) == ("modelled", level)
    assert _job(tmp_path, BASE).modelled.timing_log_level == 0
    with pytest.raises(UserError, match="--timing-log-level is 3; Megatron-LM takes 0, 1 or 2"):
        _job(tmp_path, BASE + "\n--timing-log-level: 3")
