"""`ckplan search` takes the settings `evaluate` and `solve` take (--compile, --float8,
--fp8-all-gather, --op-level-sac, --tp-overlap, --cp, --cp-comm, --runtime-version, ...): each reaches
every configuration it scores, the configurations scored beside it and the plan it writes, and what
the cost model does not model is refused in one sentence, as evaluate refuses it."""

from __future__ import annotations

import json

import pytest
from fixtures.cli import run, run_ok
from test_launchers import _tiny_config

from planner import io
from planner.commands.search_settings import DEFAULTS

JOB = ("--gpus", "8", "--global-batch", "8", "--seq-len", "512", "--runtime", "torchtitan")
# a hand configuration scored beside the search: TP 2 with SP (so --tp-overlap has collectives to
# hide), one stage, no recompute
HAND = ("--tp", "2", "--sp", "--micro-batch-size", "1", "--hand-recompute", "none")


def _search(tmp_path, *extra, hand=HAND):
    out = tmp_path / "best.yaml"
    result = run_ok("search", "--arch-config", _tiny_config(tmp_path), *JOB, "--top", "1", "--json", "--out", out,
                    *hand, *extra)
    data = json.loads(result.stdout)
    return data, io.load_plan(out), " ".join(result.stderr.split())


def _rescored(tmp_path, plan):
    """The plan written, scored as `ckplan evaluate` scores a plan: its profile beside it, the
    setup's Float8 records applied (the profile file holds them unapplied, as `solve` writes it)."""
    from planner.cost import costmodel
    from planner.cost.float8 import float8_profile

    profile = float8_profile(io.load_profile(tmp_path / "best.profile.json"), plan.setup)
    return costmodel.evaluate(plan.stages, profile, plan.setup).iteration_ms


SETTINGS = [
    (("--compile",), {"compile": True, "compile_loss": None}),
    (("--compile", "model"), {"compile": True, "compile_loss": False}),
    (("--compile", "loss"), {"compile": False, "compile_loss": True}),
    (("--float8",), {"float8": True}),
    (("--float8", "--fp8-all-gather"), {"float8": True, "fp8_all_gather": True}),
    (("--op-level-sac",), {"op_level_sac": True}),
    (("--runtime-version", "9dec370"), {"runtime_version": "9dec370"}),
    (("--optimizer-state-dtype", "bf16"), {"optimizer_state_dtype": "bf16"}),
]


@pytest.mark.parametrize("flags, fields", SETTINGS, ids=[" ".join(f) for f, _ in SETTINGS])
def test_each_setting_is_in_the_plan_written_and_scores_it_as_evaluate_does(tmp_path, flags, fields):
    data, plan, _ = _search(tmp_path, *flags, hand=())
    assert {name: getattr(plan.setup.training, name) for name in fields} == fields
    assert data["settings"] == {name: value for name, value in fields.items() if DEFAULTS[name] != value}
    assert _rescored(tmp_path, plan) == pytest.approx(data["ranked"][0]["iteration_ms"], rel=1e-12)


def test_tp_overlap_reaches_the_comm_part_and_hides_the_tp_collectives(tmp_path):
    plain, _, _ = _search(tmp_path)
    hidden, plan, _ = _search(tmp_path, "--tp-overlap", "async-tp", hand=HAND)
    assert plain["compared"][0]["degrees"]["tp"] == 2
    # TP 2 collectives are charged in the search (solve's links), and AsyncTP hides them under the matmuls
    assert hidden["compared"][0]["iteration_ms"] < plain["compared"][0]["iteration_ms"]
    # in memory AsyncTP adds only its symmetric workspace, outside the caching allocator: two row chunks
    # of a fused reduce-scatter's bf16 partials, 2 x (512 tokens x hidden 512 x 2 B) / TP 2
    assert hidden["compared"][0]["device_bytes_max"] - plain["compared"][0]["device_bytes_max"] == 2 * 512 * 512 * 2 // 2
    if plan.setup.comm.tp > 1:
        assert plan.setup.comm.tp_overlap == "async-tp"


def test_every_configuration_searched_gets_the_settings(tmp_path):
    """jobsearch.candidates: every setup carries them; Float8's records applied to each profile, the
    plan's profile kept without them."""
    from planner.commands.search import _job, _model
    from planner.models import archs
    from planner.solve import jobsearch

    model = _model(None, _tiny_config(tmp_path), None, both=False)
    job = _job(model, gpus=8, per_node=8, global_batch=8, seq_len=512, schedules=("1F1B",), chunks=(2,),
               micro_batch_sizes=(1,), runtime="torchtitan")
    options = jobsearch.JobOptions(mem_cap_bytes=2**36, gpus_per_node=8, runtime="torchtitan", tp_overlap="async-tp",
                                   training={"float8": True, "compile": True, "op_level_sac": True})
    outcome = jobsearch.Outcome()
    found = jobsearch.candidates(job, options, jobsearch.Profiles(model.profile_for(archs.gpu("h100"), 512)), outcome)
    assert len(found) == outcome.considered - outcome.duplicates > 10
    assert all(c.setup.training.float8 and c.setup.training.compile and c.setup.training.op_level_sac for c in found)
    assert all(c.setup.comm.tp_overlap == ("async-tp" if c.degrees.tp > 1 else "none") for c in found)
    assert all(c.setup.comm.tp_gb_per_s for c in found if c.degrees.tp > 1)
    assert all(c.plan_profile is not None and c.profile.layers[1].fwd_ms != c.plan_profile.layers[1].fwd_ms
               for c in found)


def test_compile_components_move_the_memory_of_a_configuration(tmp_path):
    """At TP 1 (where the analytic profile records compiled kept bytes) the blocks compiled keep less,
    the compiled loss (a 128,000-token vocabulary, so that it sets the peak) keeps less than
    torchtitan's eager one, both together the least."""
    config = _tiny_config(tmp_path, vocab_size=128000)
    hand = ("--tp", "1", "--micro-batch-size", "1", "--hand-recompute", "none")

    def device_bytes(*flags):
        result = run_ok("search", "--arch-config", config, "--gpus", "8", "--global-batch", "8", "--seq-len", "2048",
                        "--runtime", "torchtitan", "--top", "1", "--json", "--out", tmp_path / "p.yaml", *hand, *flags)
        return json.loads(result.stdout)["compared"][0]["device_bytes_max"], " ".join(result.stderr.split())

    eager, _ = device_bytes()
    model, said = device_bytes("--compile", "model")
    assert "runs the loss eager; 4 of 6 layers keep what the profile recorded under compile" in said
    loss, said = device_bytes("--compile", "loss")
    assert "compiles the loss (charged as read from inductor's code; timed by inductor's kernels); the layers eager" in said
    both, _ = device_bytes("--compile")
    assert both < model < eager and both < loss < eager
    old, said = device_bytes("--compile", "loss", "--runtime-version", "9dec370")
    assert "torchtitan 9dec370 does not compile the loss" in said
    assert old == device_bytes("--runtime-version", "9dec370")[0]


def test_float8_and_bf16_moments_reach_the_configurations_scored_beside(tmp_path):
    base, _, _ = _search(tmp_path)
    float8, _, _ = _search(tmp_path, "--float8")
    moments, _, _ = _search(tmp_path, "--optimizer-state-dtype", "bf16")
    assert float8["compared"][0]["iteration_ms"] != base["compared"][0]["iteration_ms"]
    assert moments["compared"][0]["device_bytes_max"] < base["compared"][0]["device_bytes_max"]


def test_cp_restricts_the_search_to_its_degree(tmp_path):
    data, plan, _ = _search(tmp_path, "--cp", "2", "--top", "3", hand=())
    assert {row["degrees"]["cp"] for row in data["ranked"]} == {2}
    assert plan.setup.training.context_parallel == 2 and plan.setup.training.cp_comm is None
    data, plan, _ = _search(tmp_path, "--cp", "2", "--cp-comm", "p2p", hand=())
    assert plan.setup.training.cp_comm == "p2p"


@pytest.mark.parametrize("flags, said", [
    (("--runtime", "ckplan", "--float8"), "Float8 linears (--float8) are not modelled under --runtime ckplan"),
    (("--fp8-all-gather",), "gathers Float8 linears' weights: give --float8 too"),
    (("--runtime", "megatron", "--tp-overlap", "async-tp"), "--tp-overlap async-tp is a setting of torchtitan's"),
    (("--runtime", "ckplan", "--cp", "2"), "ckplan's runtime runs no context parallelism"),
    (("--cp", "3"), "--cp 3 does not divide --gpus 8"),
    (("--cp", "8", "--cp-comm", "a2a"), "--cp 8 does not divide them (Transformer Engine refuses it)"),
    (("--runtime-version", "abc"), "--runtime-version abc is not one read for torchtitan"),
    (("--runtime", "megatron", "--chunked-cross-entropy"), "chunked cross-entropy (--chunked-cross-entropy 8) is "
                                                              "torchtitan 0.3.0's ChunkedLossWrapper"),
    (("--mtp-layers", "1"), "multi-token prediction (--mtp-layers 1) is not modelled"),
    (("--expert-tp", "3"), "--expert-tp 3: expert tensor parallelism is modelled equal to TP"),
    (("--compile", "optimizer"), "name what torch.compile compiles, model and/or loss"),
    (("--gpu", "a100-80g", "--float8"), "--float8 needs a profile that records its Float8 linears"),
    (("--cp", "2", "--tp", "1", "--micro-batch-size", "1"), "a hand configuration (--tp, --pp, ...) runs without"),
    (("--expert-tp", "2", "--tp", "1", "--micro-batch-size", "1"), "--expert-tp 2 with a hand configuration at --tp 1"),
])
def test_what_is_not_modelled_is_refused_in_one_sentence(tmp_path, flags, said):
    result = run("search", "--arch-config", _tiny_config(tmp_path), *JOB, "--top", "1", "--out", tmp_path / "p.yaml",
                 *flags)
    assert result.exit_code != 0 and said in " ".join(result.output.split())
    assert "Traceback" not in result.output and not (tmp_path / "p.yaml").exists()


def test_op_level_sac_needs_blocks_that_offer_it(tmp_path):
    """--op-level-sac on a model whose blocks offer no op-level policy (a GPT block: opsac.py offers it
    for LLaMA-style blocks with flash attention, dense or MoE, GQA or latent) would change nothing: refused."""
    result = run("search", "--arch", "gpt3-175b", *JOB, "--top", "1", "--out", tmp_path / "p.yaml",
                 "--op-level-sac")
    assert result.exit_code != 0 and "--op-level-sac needs a profile whose blocks offer" in result.output


def test_a_framework_files_settings_other_than_the_searchs_are_said_beside_it():
    """--from-torchtitan's configuration is scored with the search's settings; those its file sets
    otherwise (here: the blocks compiled, the loss eager, Float8) are said, not dropped."""
    from planner.commands.search_compare import from_framework_job
    from planner.models import archs
    from planner.models.configs import torchtitan

    job = torchtitan.from_mapping({"model": {"name": "llama3", "flavor": "8B", "converters": ["float8"]},
                                   "activation_checkpoint": {"mode": "full"},
                                   "quantize": {"linear": {"float8": {"filter_fqns": ["output"]}}},
                                   "compile": {"enable": True, "components": ["model"]}}, "t.toml")
    searched = {"compile": True, "compile_loss": None, "float8": False, "tp_overlap": "none"}
    said = from_framework_job(job, arch=archs.arch("llama3-8b"), gpu="h100", seq_len=8192,
                              settings=searched).not_expressible
    assert "torch.compile of the loss off (scored on, as the search)" in said
    assert "Float8 linears on (scored off, as the search)" in said
    assert "torch.compile of the blocks" not in said  # the same in both
    same = searched | {"compile_loss": False, "float8": True}
    assert from_framework_job(job, arch=archs.arch("llama3-8b"), gpu="h100", seq_len=8192,
                              settings=same).not_expressible == ""
    old = torchtitan.from_mapping({"model": {"name": "llama3", "flavor": "8B"}, "activation_checkpoint": {"mode": "full"},
                                   "training": {"tensor_parallel_degree": 1}}, "old.toml")  # 2024's spelling
    assert from_framework_job(old, arch=archs.arch("llama3-8b"), gpu="h100", seq_len=8192, settings={}).not_expressible \
        == "the runtime version 9dec370 (scored the newest read, as the search)"


def test_the_torchtitan_export_of_a_compiled_plan_writes_what_to_compile(tmp_path):
    """The exported file's [compile] section compiles the components the plan was scored compiled
    with (tests/test_export_compile.py reads it back), and is off for a plan scored eager."""
    import tomllib

    _search(tmp_path, "--compile", "model", hand=())
    run_ok("export", tmp_path / "best.yaml", "--to", "torchtitan", "--torchtitan-version", "0.2.2")
    written = tomllib.loads((tmp_path / "best.torchtitan.toml").read_text())
    assert written["compile"] == {"enable": True, "components": ["model"]}
    _search(tmp_path, hand=())
    run_ok("export", tmp_path / "best.yaml", "--to", "torchtitan", "--torchtitan-version", "0.2.2", "--out",
           tmp_path / "eager.toml")
    assert tomllib.loads((tmp_path / "eager.toml").read_text())["compile"] == {"enable": False}


def test_the_table_says_what_every_configuration_was_scored_with(tmp_path):
    result = run_ok("search", "--arch-config", _tiny_config(tmp_path), *JOB, "--top", "1", "--out",
                    tmp_path / "best.yaml", "--compile", "model", "--float8", "--tp-overlap", "async-tp")
    assert ("every configuration scored with --compile model --float8 --tp-overlap async-tp"
            in " ".join(result.output.split()))


@pytest.mark.parametrize("tp, pp", [(2, 1), (2, 2), (1, 4), (8, 2)])
def test_search_charges_the_tp_collectives_and_pipeline_sends_as_solve_does(tmp_path, tp, pp):
    """jobsearch.job_setup's links are comm_setup.comm_fields' (what `ckplan solve` charges) for the
    same profile, data parallelism and node."""
    from planner.commands.comm_setup import comm_fields
    from planner.commands.search import _model
    from planner.commands.setup_options import DataParallelOptions
    from planner.models import archs
    from planner.solve import jobsearch
    from planner.solve.degrees import Degrees

    node = 8  # 16 GPUs: two nodes, so a wide pipeline's sends cross the network
    profile = _model(None, _tiny_config(tmp_path), None, both=False).profile_for(archs.gpu("h100"), 512)(tp, tp > 1, 1)
    dp = 16 // (tp * pp)
    degrees = Degrees(tp=tp, sp=tp > 1, pp=pp, dp=dp, micro_batch_size=1, microbatches=2 * pp)
    searched = jobsearch.job_setup(profile, degrees, jobsearch.JobOptions(mem_cap_bytes=2**36, gpus_per_node=node))
    solved = comm_fields(profile, DataParallelOptions(dp=dp, gpus_per_node=node), runtime="ckplan")
    names = (["tp", "tp_gb_per_s", "tp_step_latency_ms", "collective_latency_ms"] if tp > 1 else []) + \
        (["pp_gb_per_s", "pp_latency_ms", "pp_stride", "pp_network_gb_per_s", "pp_network_latency_ms"]
         if pp > 1 else [])
    assert names
    assert {name: getattr(searched.comm, name) for name in names} == {name: solved[name] for name in names}


def test_a_stated_allocator_setting_is_said_as_its_flag():
    from planner.commands.search_settings import spelled, stated

    training = {**{k: v for k, v in DEFAULTS.items() if k != "tp_overlap"}, "expandable_segments": False}
    assert spelled(stated(training, "none")) == "--no-expandable-segments"
    assert spelled(stated({**training, "expandable_segments": True}, "none")) == "--expandable-segments"
    assert stated({**training, "expandable_segments": None}, "none") == {}
