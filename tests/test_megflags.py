"""What the Megatron reader says of the flags issue 33 names, and what each class does to the prediction
(docs/framework-facts.md §159): --softmax-type learnable (modelled: the sinks' parameters, no eager rescale),
--glu-linear-offset inside the fused quick-GeGLU and checkpoint flags (no effect: the prediction unchanged),
--moe-router-force-load-balancing (modelled: the balanced routing charged anyway), fine-grained offloading
(not modelled: listed, the prediction without it)."""

from __future__ import annotations

import json

import pytest
import yaml
from fixtures.cli import run, run_ok

from planner.errors import UserError
from planner.models.configs import megatron, megatron_flags

# a two-layer MoE of four experts, GPT-OSS's way (quick-GeGLU): 8 heads, 2 layers, so 16 sinks
BASE = {"--num-layers": 2, "--hidden-size": 256, "--num-attention-heads": 8, "--group-query-attention": True,
        "--num-query-groups": 2, "--seq-length": 512, "--vocab-size": 1024, "--quick-geglu": True,
        "--micro-batch-size": 1, "--global-batch-size": 8, "--bf16": True, "--num-experts": 4,
        "--moe-router-topk": 2, "--moe-ffn-hidden-size": 256}
SINKS = 2 * 8


def _pairs(extra: dict) -> list[tuple[str, list[str]]]:
    return [(flag, [] if value is True else [str(value)]) for flag, value in {**BASE, **extra}.items()]


def _said(job) -> dict[str, tuple[str, str]]:
    return {s.name: (s.status, s.what) for s in job.settings}


def _evaluate(tmp_path, name: str, extra: dict, env: dict | None = None) -> dict:
    data = {"MODEL_ARGS": {**BASE, **extra}}
    if env:
        data["ENV_VARS"] = env
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return json.loads(run_ok("evaluate", "--from-megatron", path, "--gpus", "1", "--gpu", "h100", "--json").stdout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("megflags")
    return {
        "base": _evaluate(tmp, "base", {}),
        "sinks": _evaluate(tmp, "sinks", {"--softmax-type": "learnable"}),
        "listed": _evaluate(tmp, "listed", {"--glu-linear-offset": 1.0, "--auto-detect-ckpt-format": True,
                                            "--no-ckpt-fully-parallel-save": True, "--apply-rope-fusion": True,
                                            "--moe-router-force-load-balancing": True,
                                            "--fine-grained-activation-offloading": True,
                                            "--offload-modules": "[expert_fc1 moe_act]"},
                            env={"NCCL_DEBUG": "VERSION", "NVTE_CPU_OFFLOAD_V1": 1}),
        "expandable": _evaluate(tmp, "expandable", {}, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    }


def _status(result: dict) -> dict[str, str]:
    return {s["name"]: s["status"] for s in result["settings"]}


def test_learnable_sinks_are_parameters_inside_the_kernel(runs):
    """--softmax-type learnable adds one parameter per head and layer to the rank's static bytes (weights, main
    gradients, master and Adam's moments, as every other parameter) and nothing to the kept activations (TE's cuDNN kernel applies them: no eager rescale, no tensor of its own)."""
    base, sinks = runs["base"]["ranks"][0], runs["sinks"]["ranks"][0]
    assert _status(runs["sinks"])["--softmax-type"] == "modelled"
    # a bf16 weight, its fp32 main gradient, the fp32 master and Adam's two fp32 moments: 2 + 4 + 4 + 4 + 4 B
    assert sinks["static_bytes"] - base["static_bytes"] == SINKS * (2 + 4 + 4 + 4 + 4)
    assert sinks["peak_bytes"] - sinks["static_bytes"] == base["peak_bytes"] - base["static_bytes"]
    assert sinks["time_ms"] == base["time_ms"]  # the forward and backward: the kernel's own sinks, no eager pass
    assert runs["sinks"]["iteration_ms"] > runs["base"]["iteration_ms"]  # the optimizer step's 16 more parameters


def test_no_effect_and_not_modelled_flags_leave_the_prediction_and_are_listed(runs):
    """No effect (the offset inside the fused quick-GeGLU, checkpoint flags, NCCL_DEBUG), modelled as charged anyway
    (forced balanced routing) and not modelled (fine-grained offloading): the prediction is the base one, each
    flag listed with its status."""
    base, listed = runs["base"], runs["listed"]
    for key in ("static_bytes", "peak_bytes", "reserved_bytes", "time_ms"):
        assert listed["ranks"][0][key] == base["ranks"][0][key], key
    assert listed["iteration_ms"] == base["iteration_ms"]
    status = _status(listed)
    assert {flag: status[flag] for flag in ("--glu-linear-offset", "--auto-detect-ckpt-format",
                                            "--no-ckpt-fully-parallel-save", "--apply-rope-fusion",
                                            "ENV_VARS.NCCL_DEBUG")} == dict.fromkeys(
        ("--glu-linear-offset", "--auto-detect-ckpt-format", "--no-ckpt-fully-parallel-save", "--apply-rope-fusion",
         "ENV_VARS.NCCL_DEBUG"), "no effect")
    assert status["--moe-router-force-load-balancing"] == "modelled"
    assert {status[f] for f in ("--fine-grained-activation-offloading", "--offload-modules",
                                "ENV_VARS.NVTE_CPU_OFFLOAD_V1")} == {"not modelled"}
    assert "unknown" not in status.values()


def test_the_reader_sets_the_sink_fields_from_the_flag_not_the_name():
    plain = megatron.from_pairs(_pairs({}), "gpt_oss_120b.yaml").arch
    assert not plain.attention_sinks and not plain.sinks_in_kernel  # a GPT-OSS name gives no sinks
    sinks = megatron.from_pairs(_pairs({"--softmax-type": "learnable"}), "t.yaml").arch
    assert sinks.attention_sinks and sinks.sinks_in_kernel
    job = megatron.from_pairs(_pairs({"--softmax-type": "off-by-one"}), "t.yaml")
    assert not job.arch.attention_sinks and _said(job)["--softmax-type"][0] == "no effect"
    assert _said(megatron.from_pairs(_pairs({"--softmax-type": "vanilla"}), "t.yaml"))["--softmax-type"][0] == "modelled"
    with pytest.raises(UserError, match="--softmax-type 'sinks' is not one of Megatron-LM's"):
        megatron.from_pairs(_pairs({"--softmax-type": "sinks"}), "t.yaml")


def test_the_glu_offset_is_said_by_the_path_megatron_takes():
    """Inside the fused quick-GeGLU: no effect; with a SiLU GLU's fused kernel Megatron-core passes no offset: no
    effect; the eager GLU (--no-bias-swiglu-fusion) adds it: not modelled; 0: no effect."""
    def status(extra):
        return _said(megatron.from_pairs(_pairs(extra), "t.yaml"))["--glu-linear-offset"]

    assert status({"--glu-linear-offset": 1.0})[0] == "no effect"
    assert "jit-fused quick-GeGLU" in status({"--glu-linear-offset": 1.0})[1]
    silu = {"--quick-geglu": "false", "--swiglu": True, "--glu-linear-offset": 1.0}
    assert "takes no offset" in status(silu)[1]
    assert status({**silu, "--no-bias-swiglu-fusion": True})[0] == "not modelled"
    assert status({"--glu-linear-offset": 0})[0] == "no effect"


def test_rope_fusion_given_false_is_the_unfused_rotary():
    said = _said(megatron.from_pairs(_pairs({"--apply-rope-fusion": "false"}), "t.yaml"))
    assert said["--apply-rope-fusion"][0] == "not modelled" and "rotary as eager ops" in said["--apply-rope-fusion"][1]


def test_forced_balancing_given_false_is_no_effect():
    said = _said(megatron.from_pairs(_pairs({"--moe-router-force-load-balancing": "false"}), "t.yaml"))
    assert said["--moe-router-force-load-balancing"][0] == "no effect"


def test_a_bad_softmax_type_is_one_sentence(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"MODEL_ARGS": {**BASE, "--softmax-type": "sinks"}}))
    result = run("evaluate", "--from-megatron", path, "--gpus", "1", "--gpu", "h100")
    assert result.exit_code != 0 and "--softmax-type 'sinks' is not one of Megatron-LM's" in result.output


def test_the_launchs_expandable_segments_reach_the_allocator_replay(runs):
    """ENV_VARS' PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (six of the functional tests') is the setup's
    expandable_segments: the same allocated bytes, the replay's reserve under expandable segments (lower here)."""
    base, expandable = runs["base"]["ranks"][0], runs["expandable"]["ranks"][0]
    assert _status(runs["expandable"])["ENV_VARS.PYTORCH_CUDA_ALLOC_CONF"] == "modelled"
    assert expandable["peak_bytes"] == base["peak_bytes"] and expandable["time_ms"] == base["time_ms"]
    assert expandable["reserved_by"] == base["reserved_by"] == "replay"
    assert expandable["reserved_bytes"] < base["reserved_bytes"]


def test_alloc_conf_options_other_than_expandable_segments_are_listed():
    assert megatron_flags.alloc_conf("expandable_segments:True") == (True, [])
    assert megatron_flags.alloc_conf("max_split_size_mb:512, expandable_segments:False") == (False,
                                                                                             ["max_split_size_mb:512"])
    data = {"MODEL_ARGS": {}, "ENV_VARS": {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"}}
    assert megatron_flags.launch_expandable_segments(data) is None
    [(name, _, status, what)] = megatron_flags.yaml_extras(data)
    assert (name, status) == ("ENV_VARS.PYTORCH_CUDA_ALLOC_CONF", "not modelled") and "garbage_collection" in what
    assert megatron_flags.launch_expandable_segments({"MODEL_ARGS": {}}) is None
