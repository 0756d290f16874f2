"""Tied weights beside a pipeline under a runtime that does not tie them (the record's ties_across_stages;
docs/framework-facts.md §248, §305): torchtitan refuses tying with pipeline_parallel_degree > 1 (b5bcd76c), and
before it tied its pipeline split kept a shared parameter's copies apart. evaluate, solve, search and
export --to torchtitan refuse such a job in one sentence (search its pipelines one by one); one stage, and the
runtimes that sum the copies, plan it."""

import json

import pytest
from fixtures.cli import run, run_ok

from planner import io
from planner.cost import runnable, runtimes
from planner.schema import DeviceInfo, FileRef, LayerProfile, Profile, TiedSet

SHARED = 1_000_000


def _profile(path, *, tied: bool = True):
    def layer(name: str) -> LayerProfile:
        return LayerProfile(name=name, kind=name, fwd_ms=1.0, bwd_ms=2.0, fwd_ms_min=1.0, fwd_ms_max=1.0,
                            bwd_ms_min=2.0, bwd_ms_max=2.0, act_bytes=1 << 20, input_bytes=1 << 10,
                            output_bytes=1 << 10, param_count=SHARED, param_bytes=2 * SHARED, transient_bytes=0)

    sets = [TiedSet(layers=["embed", "head"], param_count=SHARED, param_bytes=2 * SHARED)] if tied else []
    profile = Profile(name="tied", created_at="now", torch_version="x", device=DeviceInfo(type="cpu", name="cpu"),
                      dtype="float32", micro_batch_size=1, model=FileRef(file="m.py", sha256="0" * 64),
                      layers=[layer("embed"), layer("block"), layer("head")], tied=sets)
    io.save_profile(profile, path)
    return path


def _evaluate(profile, layers: str, *extra):
    return run("evaluate", "--profile", profile, "--layers-per-stage", layers,
               "--ckpt-per-stage", ",".join("0" for _ in layers.split(",")), "--mem", "1GiB", *extra)


@pytest.mark.parametrize("version", runtimes.VERSIONS["torchtitan"])
def test_evaluate_refuses_a_tied_model_split_over_stages_under_torchtitan(tmp_path, version):
    profile = _profile(tmp_path / "p.json")
    result = _evaluate(profile, "2,1", "--runtime", "torchtitan", "--runtime-version", version)
    assert result.exit_code != 0
    assert "ties weights (embed and head share a parameter)" in result.output
    assert f"--runtime torchtitan {version} does not tie them beside a pipeline of 2 stages" in result.output
    one = _evaluate(profile, "3", "--microbatches", "1", "--runtime", "torchtitan", "--runtime-version", version)
    assert one.exit_code == 0, one.output


@pytest.mark.parametrize("runtime", ["ckplan", "megatron", "deepspeed", "colossalai"])
def test_the_runtimes_that_sum_the_copies_evaluate_it(tmp_path, runtime):
    result = _evaluate(_profile(tmp_path / "p.json"), "2,1", "--runtime", runtime)
    assert result.exit_code == 0, result.output


def test_an_untied_model_splits_under_torchtitan(tmp_path):
    result = _evaluate(_profile(tmp_path / "p.json", tied=False), "2,1", "--runtime", "torchtitan")
    assert result.exit_code == 0, result.output


def test_solve_and_search_refuse_it(tmp_path):
    profile = _profile(tmp_path / "p.json")
    solved = run("solve", "--profile", profile, "--stages", "2", "--runtime", "torchtitan", "--mem", "1GiB",
                 "--out", tmp_path / "plan.yaml")
    assert solved.exit_code != 0 and "does not tie them beside a pipeline of 2 stages" in solved.output
    assert not (tmp_path / "plan.yaml").exists()
    searched = run("search", "--profile", profile, "--gpus", "2", "--global-batch", "4", "--runtime", "torchtitan",
                   "--mem", "1GiB", "--seq-len", "16", "--json")
    assert searched.exit_code == 0, searched.output  # its pipelines refused one by one, the rest searched
    found = json.loads(searched.output[searched.output.index("{"):])
    ranked = found["ranked"]
    assert ranked and all(entry["degrees"]["pp"] == 1 for entry in ranked), ranked
    assert found["counts"]["refused"] > 0


def test_export_to_torchtitan_refuses_a_split_tied_plan(tmp_path):
    profile = _profile(tmp_path / "p.json")
    run_ok("solve", "--profile", profile, "--stages", "2", "--mem", "1GiB", "--out", tmp_path / "plan.yaml")
    refused = run("export", tmp_path / "plan.yaml", "--to", "torchtitan")
    assert refused.exit_code != 0
    assert "torchtitan b5bcd76c does not tie them beside a pipeline of 2 stages" in refused.output
    assert "torchtitan/models/common/decoder.py 168-171" in refused.output
    run_ok("export", tmp_path / "plan.yaml", "--to", "deepspeed", "--out", tmp_path / "plan.json")


def test_the_record_says_which_runtimes_tie_across_stages():
    assert [name for name in runtimes.VERSIONS if not runtimes.facts(name).ties_across_stages] == ["torchtitan"]
    assert runnable.tied_refused("torchtitan", None, stages=1, tied=[object()]) is None
    assert runnable.tied_refused("torchtitan", None, stages=2, tied=[]) is None
