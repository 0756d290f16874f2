"""`ckplan solve --auto-dp` on a small profile: one row per ZeRO stage x shard group x offload,
each re-solved, the fastest that fits recommended and written; the exports' ZeRO refusals."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from planner import io
from planner.cli import cli
from planner.commands.auto_dp import combinations
from planner.cost import costmodel, dataparallel
from planner.emit import colossalai, deepspeed, dp_support, megatron
from planner.models.synthetic import layer, profile_of

MB = 10**6


def static_heavy_profile():
    """Embedding, 6 blocks of 2 M params (32 MB each at bf16-mixed Adam without ZeRO), head;
    small activations, so the static state decides what fits."""
    layers = [layer("tok_embeddings", "Embedding", fwd_ms=0.5, act_mib=0.01, input_mib=0.01, output_mib=1,
                    param_count=500_000)]
    layers += [layer(f"layers.{i}", "Block", fwd_ms=10, act_mib=2, input_mib=1, param_count=2_000_000,
                     adam_step_ms=4.0) for i in range(6)]
    layers += [layer("output", "Head", fwd_ms=4, act_mib=3, input_mib=1, output_mib=2, param_count=500_000)]
    return profile_of(layers, name="heavy").model_copy(update={"host_step_ns_per_param": {"adam": 2.0, "sgd": 1.0}})


@pytest.fixture()
def profile_path(tmp_path):
    path = tmp_path / "heavy.json"
    io.save_profile(static_heavy_profile(), path)
    return path


ARGS = ["--stages", "3", "--microbatches", "6", "--precision", "bf16-mixed", "--mem", "90MB", "--dp", "4",
        "--shard-bandwidth", "10", "--replica-bandwidth", "2", "--host-bandwidth", "5", "--auto-dp"]


def test_combinations_for_dp_4():
    rows = combinations(4, offload_choices=(False, True))
    # ZeRO 0 once, ZeRO 1-3 in groups of 2 and 4; each with and without offload
    assert len(rows) == 2 + 3 * 2 * 2
    assert (0, None, False) in rows and (3, 4, True) in rows and (1, 1, False) not in rows


def test_auto_dp_table_and_recommendation(profile_path, tmp_path):
    out = tmp_path / "plan.yaml"
    result = CliRunner().invoke(cli, ["solve", "--profile", str(profile_path), *ARGS, "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["combinations"]
    assert len(rows) == 14
    # ZeRO 0 keeps 16 B/param, 208 MB over 3 stages: the evenest split holds 72 MB of state on a
    # stage beside its activations and buffers, and no plan fits 90 MB
    zero0 = [r for r in rows if r["zero"] == 0 and not r["offload"]]
    assert not zero0[0]["fits"] and zero0[0]["why_not"] == "device memory"
    fitting = [r for r in rows if r["fits"]]
    best = min(fitting, key=lambda r: r["iteration_ms"])
    assert [r for r in rows if r["best"]] == [best]
    plan = io.load_plan(out)
    assert (plan.setup.data_parallel.zero, dataparallel.shard_size(plan.setup), plan.setup.data_parallel.offload) == (
        best["zero"], best["shard_group"], best["offload"])
    again = costmodel.evaluate(plan.stages, static_heavy_profile(), plan.setup)
    assert again.iteration_ms == pytest.approx(best["iteration_ms"], rel=1e-12)
    refused = {(r["zero"], tuple(r["refused_by"])) for r in rows}
    assert (2, ("ColossalAI", "DeepSpeed", "Megatron-LM")) in refused and (1, ()) in refused


def test_auto_dp_prints_one_table_and_the_recommendation(profile_path, tmp_path):
    result = CliRunner().invoke(cli, ["solve", "--profile", str(profile_path), *ARGS, "--out",
                                      str(tmp_path / "plan.yaml")], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "--auto-dp: dp 4 x 3 stages" in result.output
    assert "recommended: ZeRO-" in result.output
    assert "RS grads/2+AR/2" in result.output  # groups of 2, all-reduced across 2 replicas
    # the offload rows' host step: its source beside the table, and how to give the hosts' own
    assert "host adam step: 2 ns per parameter, measured by `ckplan profile` on the profiled machine; " \
           "give the training hosts' with --host-step-ns" in result.output


def test_auto_dp_refuses_the_options_it_tries(profile_path, tmp_path):
    result = CliRunner().invoke(cli, ["solve", "--profile", str(profile_path), *ARGS, "--zero", "1",
                                      "--out", str(tmp_path / "plan.yaml")])
    assert result.exit_code == 1
    assert "--auto-dp tries every --zero" in result.output


def test_auto_dp_says_when_nothing_fits(profile_path, tmp_path):
    args = [a if a != "90MB" else "5MB" for a in ARGS]
    result = CliRunner().invoke(cli, ["solve", "--profile", str(profile_path), *args, "--out",
                                      str(tmp_path / "plan.yaml")], env={"COLUMNS": "250"})
    assert result.exit_code == 1
    assert "no combination of ZeRO stage, shard group and offload fits with --dp 4" in result.output
    assert not (tmp_path / "plan.yaml").exists()


def test_auto_dp_says_time_limit_not_memory_when_the_solver_ran_out(profile_path, tmp_path, monkeypatch):
    """A combination whose solve ran out of --time-limit may well fit: its row says so, and
    with nothing else fitting the error says to raise --time-limit, not --mem."""
    from planner.solve import planning

    solve = planning.make_plan
    ran_out = planning.Unplanned("timeout", None, 60.0)

    def running_out_on_zero3(profile, path, setup, **kwargs):
        if setup.data_parallel.zero == 3:
            return ran_out
        return solve(profile, path, setup, **kwargs)

    monkeypatch.setattr(planning, "make_plan", running_out_on_zero3)
    result = CliRunner().invoke(cli, ["solve", "--profile", str(profile_path), *ARGS, "--out",
                                      str(tmp_path / "plan.yaml"), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["combinations"]
    assert {r["why_not"] for r in rows if r["zero"] == 3} == {"time limit"}
    assert {r["why_not"] for r in rows if r["zero"] == 0 and not r["offload"]} == {"device memory"}

    monkeypatch.setattr(planning, "make_plan", lambda *a, **k: ran_out)
    result = CliRunner().invoke(cli, ["solve", "--profile", str(profile_path), *ARGS, "--out",
                                      str(tmp_path / "none.yaml")], env={"COLUMNS": "250"})
    assert result.exit_code == 1
    assert "no (time limit)" in result.output, result.output
    assert "raise --time-limit" in result.output
    assert not (tmp_path / "none.yaml").exists()


# ---------------------------------------------------------------- exports


def test_exports_round_zero_2_to_what_the_framework_runs_beside_a_pipeline(tmp_path):
    from export_plans import write

    _, plan, _ = write(tmp_path, [4, 3, 3], {"layers.1"})
    plan = plan.model_copy(update={"setup": plan.setup.model_copy(update={"dp": 4, "zero": 2})})
    profile = io.load_profile(tmp_path / "llm.json")
    for module in (colossalai, deepspeed, megatron):
        exported = module.export(plan, profile, plan_file="plan.yaml")
        assert exported.rounded.setup.data_parallel.zero == 1
        assert any("cannot run ZeRO-2 with 3 pipeline stages" in c for c in exported.rounded.changes), module
    assert "zero_stage=1" in colossalai.export(plan, profile, plan_file="plan.yaml").text
    assert dp_support.refusal("ColossalAI", plan.setup.model_copy(update={"zero": 1})) is None
    assert dp_support.refusal("DeepSpeed", plan.setup.model_copy(update={"stages": 1, "mem_caps_bytes": [MB]})) is None


@pytest.mark.parametrize("version", ["0.3.0", "0.2.0"])
def test_torchtitan_export_says_the_shard_and_replicate_degrees(tmp_path, version):
    from export_plans import write

    from planner.emit import torchtitan

    _, plan, _ = write(tmp_path, [4, 3, 3], {"layers.1"})
    plan = plan.model_copy(update={"setup": plan.setup.model_copy(update={"dp": 4, "zero": 1, "shard_group": 2})})
    profile = io.load_profile(tmp_path / "llm.json")
    exported = torchtitan.export(plan, profile, plan_file="plan.yaml", version=version,
                                 base="my_models.configs:eight_layers")  # a base of the plan's 8 layers
    assert "data_parallel_shard_degree = 2" in exported.text
    assert "data_parallel_replicate_degree = 2" in exported.text
    # FSDP2 under torch.distributed.pipelining keeps weights and gradients whole through the
    # iteration (0.2's TOML also rounds the checkpointing to one setting for all stages, which
    # moves the peaks): torchtitan's record holds the bf16 weights gathered beside its fp32 shard,
    # which is the master, and whole fp32 gradients, 2 + 4/K + 4 + 8/K B/param, against ckplan's
    # ZeRO 1 2 + 2 + 12/K: 2 B/param more for any K
    assert (exported.rounded.setup.data_parallel.zero, exported.rounded.setup.data_parallel.zero_gather) == (3, "per-iteration")
    params = [sum(layer.param_count for layer in profile.layers if layer.name in stage.layers)
              for stage in plan.stages]
    assert ([r.static_bytes - e.static_bytes for r, e in zip(exported.scored.rounded.stages,
                                                             exported.scored.exact.stages)]
            == [2 * p for p in params])


def test_megatron_export_shards_the_optimizer_in_groups(tmp_path):
    from export_plans import write

    _, plan, _ = write(tmp_path, [4, 3, 3], {"layers.1"})
    plan = plan.model_copy(update={"setup": plan.setup.model_copy(update={"dp": 8, "zero": 1, "shard_group": 2})})
    text = megatron.export(plan, io.load_profile(tmp_path / "llm.json"), plan_file="plan.yaml").text
    # groups of 2 ranks, 4 copies of the sharded optimizer across the data-parallel domain
    assert "--use-distributed-optimizer" in text and "--num-distributed-optimizer-instances 4" in text


def test_auto_dp_takes_host_mem_for_the_combinations_that_offload(profile_path, tmp_path):
    """--auto-dp refused --host-mem, then its error told the user to raise it: now the offloading
    combinations are planned within it (the host a constraint of the solver) and say so."""
    result = CliRunner().invoke(cli, ["solve", "--profile", str(profile_path), *ARGS, "--host-mem", "1MB",
                                      "--out", str(tmp_path / "plan.yaml"), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["combinations"]
    assert {r["why_not"] for r in rows if r["offload"]} == {"host memory"}
    assert any(r["fits"] for r in rows if not r["offload"])


def test_auto_dp_lists_a_combination_its_options_refuse_and_plans_the_rest(tmp_path):
    """--expandable-segments is read by torchtitan's FSDP2 replay (ZeRO 3, one stage); ZeRO 0 cannot take it.
    That combination is listed as refused with its sentence; the others are planned and the best written."""
    gpu = static_heavy_profile()
    gpu = gpu.model_copy(update={"device": gpu.device.model_copy(update={"type": "cuda", "name": "NVIDIA H100"})})
    path = tmp_path / "gpu.json"
    io.save_profile(gpu, path)
    args = ["--stages", "1", "--microbatches", "1", "--precision", "bf16-mixed", "--mem", "4GB", "--dp", "4",
            "--runtime", "torchtitan", "--expandable-segments", "--auto-dp"]
    result = CliRunner().invoke(cli, ["solve", "--profile", str(path), *args, "--out", str(tmp_path / "plan.yaml"),
                                      "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output[result.output.index("{"):])["combinations"]
    refused = [r for r in rows if r["why_not"] == "refused"]
    assert [r["zero"] for r in refused] == [0] * len(refused) and refused
    assert all("--expandable-segments changes the caching allocator's replay" in r["reason"] for r in refused)
    assert any(r["best"] and r["zero"] == 3 for r in rows)
    assert (tmp_path / "plan.yaml").exists()


def test_auto_dp_says_once_what_every_combination_refuses(profile_path, tmp_path):
    """On a CPU profile no combination can take an allocator flag: one sentence, no table, no plan."""
    result = CliRunner().invoke(cli, ["solve", "--profile", str(profile_path), *ARGS, "--expandable-segments",
                                      "--runtime", "torchtitan", "--out", str(tmp_path / "plan.yaml")])
    assert result.exit_code == 1
    assert "has no caching allocator to replay" in result.output and "Traceback" not in result.output
    assert "┃" not in result.output  # no table: the sentence is the whole answer
    assert not (tmp_path / "plan.yaml").exists()
