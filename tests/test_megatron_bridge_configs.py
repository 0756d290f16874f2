"""Megatron-Bridge 25.11's LLaMA performance recipes (configs/megatron-bridge/*.yaml: each recipe as the
Megatron-LM arguments it sets, docs/framework-facts.md §42) read by the Megatron-LM reader to the setup the
recipe runs, and every recipe setting the cost model leaves out named; the pipeline split of
--account-for-embedding/loss-in-pipeline-split as megatron-core's get_num_layers_to_build (92c8482e)."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.errors import UserError
from planner.models.configs import megatron

ROWS = Path(__file__).resolve().parent.parent / "configs" / "megatron-bridge"


def _read(name: str):
    return megatron.read(ROWS / f"{name}.yaml")


def _listed(job, status: str) -> set[str]:
    return {s.name for s in job.of(status)}


# recipe: (TP, SP, PP, virtual stages, CP, MBS, GBS, ZeRO, tp_overlap, recompute mode and layers)
RECIPES = {
    "b200_8b_fp8cs": (1, False, 1, 1, 1, 2, 128, 1, "none", ("none", 0)),
    "gb200_8b_fp8cs": (1, False, 1, 1, 1, 2, 128, 1, "none", ("none", 0)),
    "h100_8b_fp8cs": (1, False, 1, 1, 1, 1, 128, 3, "none", ("block", 5)),
    "h100_70b_fp8cs": (4, True, 8, 5, 1, 1, 128, 1, "tp-comm-overlap", ("none", 0)),
    "gb200_70b_fp8cs": (1, False, 1, 1, 1, 2, 256, 3, "none", ("block", 40)),  # 40 layers offloaded
    "h100_405b_fp8cs": (8, True, 8, 8, 2, 1, 512, 1, "tp-comm-overlap", ("none", 0)),
    "b200_405b_fp8cs": (4, True, 8, 8, 2, 1, 64, 1, "tp-comm-overlap", ("none", 0)),
    "gb200_405b_fp8cs": (4, True, 16, 4, 1, 1, 1536, 1, "tp-comm-overlap", ("none", 0)),
}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_each_recipe_reads_to_the_setup_it_runs(name):
    tp, sp, pp, chunks, cp, mbs, gbs, zero, overlap, (mode, layers) = RECIPES[name]
    job = _read(name)
    assert (job.tp, job.sp, job.pp, job.chunks, job.cp) == (tp, sp, pp, chunks, cp)
    assert (job.micro_batch_size, job.global_batch_size, job.seq_len, job.zero) == (mbs, gbs, 8192, zero)
    assert job.schedule == ("interleaved-1F1B" if chunks > 1 else "1F1B")
    assert (job.recompute.mode, job.recompute.num_layers) == (mode, layers)
    assert job.modelled.tp_overlap == overlap
    assert job.modelled.float8  # FP8 current scaling: --fp8-format hybrid --fp8-recipe tensorwise
    assert job.precision == "bf16-mixed"
    assert job.arch.vocab_size % (128 * tp) == 0 and 0 <= job.arch.vocab_size - 128256 < 128 * tp
    # every recipe's memory settings are read (planner/cost/bridgesettings.py), none dropped
    assert {"--fp8-param-gather", "--grad-reduce-in-bf16", "--cross-entropy-loss-fusion",
            "--cross-entropy-fusion-impl"} <= _listed(job, "modelled")
    assert (job.modelled.grad_reduce_bf16, job.modelled.fp8_all_gather, job.modelled.te_cross_entropy) == (True,) * 3
    assert not job.of("unknown")


def test_the_recipes_that_ckplan_cannot_express_say_so():
    assert {"--cuda-graph-impl", "--cuda-graph-scope"} <= _listed(_read("gb200_8b_fp8cs"), "not modelled")
    assert "--te-rng-tracker" in _listed(_read("gb200_8b_fp8cs"), "no effect")
    offload = _read("gb200_70b_fp8cs")
    # Megatron-FSDP's double buffers are read under optim_grads_params (planner/cost/megatron_fsdp.py)
    assert "--fsdp-double-buffer" in _listed(offload, "modelled") and offload.modelled.ddp["fsdp_double_buffer"]
    # its 40 layers' activation offload is read (tests/test_megatron_offload.py)
    assert {"--cpu-offloading", "--cpu-offloading-num-layers"} <= _listed(offload, "modelled")
    assert offload.modelled.unfused_grad_accumulation  # llama3_70b_pretrain_config_gb200 turns the fusion off


def test_the_405b_split_counts_the_embedding_and_the_loss_as_layers():
    # 126 decoder layers + embedding + loss = 128 over 8 x 8 virtual stages: 2 each, the first and the
    # last building one decoder layer fewer
    job = _read("h100_405b_fp8cs")
    assert job.layers_per_stage == [1] + [2] * 62 + [1]
    assert sum(job.layers_per_stage) == job.arch.num_layers == 126
    assert _read("gb200_405b_fp8cs").layers_per_stage == [1] + [2] * 62 + [1]  # 16 x 4
    assert {"--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"} <= _listed(
        job, "modelled")


def _split(tmp_path, layers: int, pp: int, extra: dict[str, str]) -> list[int]:
    path = tmp_path / "m.yaml"
    lines = {"--num-layers": str(layers), "--hidden-size": "64", "--num-attention-heads": "4", "--seq-length": "128",
             "--vocab-size": "256", "--pipeline-model-parallel-size": str(pp), "--global-batch-size": "8", **extra}
    path.write_text("MODEL_ARGS:\n" + "".join(f"  {k}: {v}\n" for k, v in lines.items()))
    return megatron.read(path).layers_per_stage


def test_the_embedding_alone_or_the_loss_alone_takes_a_layer_from_its_own_end(tmp_path):
    # 7 layers + the embedding = 8 over 4 stages: 1, 2, 2, 2; 7 + the loss: 2, 2, 2, 1
    assert _split(tmp_path, 7, 4, {"--account-for-embedding-in-pipeline-split": "true"}) == [1, 2, 2, 2]
    assert _split(tmp_path, 7, 4, {"--account-for-loss-in-pipeline-split": "true"}) == [2, 2, 2, 1]
    assert _split(tmp_path, 8, 4, {}) == [2, 2, 2, 2]


def test_a_split_megatron_refuses_is_refused(tmp_path):
    with pytest.raises(UserError, match="not a multiple of the 4 pipeline stages"):
        _split(tmp_path, 8, 4, {"--account-for-embedding-in-pipeline-split": "true"})
    with pytest.raises(UserError, match="Megatron-LM refuses uneven stages"):
        _split(tmp_path, 8, 4, {"--account-for-loss-in-pipeline-split": "true",
                                "--decoder-first-pipeline-num-layers": "1"})


def test_the_ddp_overlap_of_every_recipe_is_read_as_bridge_sets_it():
    # _llama3_common: both overlaps; comm_overlap.py 539-546 (00b7660b): 128 Mi-parameter buckets where DP > 1;
    # set_post_overrides: the first chunk's gather in the optimizer step where DP, PP and VP > 1 (B2, B4-B6)
    for name, (_, _, _, chunks, *_rest) in RECIPES.items():
        job = _read(name)
        assert {"--overlap-grad-reduce", "--overlap-param-gather", "--ddp-bucket-size"} <= _listed(job, "modelled")
        ddp = job.modelled.ddp
        assert (ddp["overlap_grad_reduce"], ddp["bucket_params"]) == (True, 128 << 20)
        assert ddp["overlap_param_gather"] == (job.zero == 1)  # Megatron-FSDP's (ZeRO 3) are its own prefetches
        assert ddp["param_gather_with_step"] == (chunks > 1)
    assert "--overlap-param-gather-with-optimizer-step" in _listed(_read("h100_70b_fp8cs"), "modelled")
