"""The profile contract: round-trips through JSON, rejects what it does not know."""

import json
import pathlib

import pytest
from pydantic import ValidationError

from planner import io
from planner.errors import UserError
from planner.schema import PROFILE_SCHEMA_VERSION, DeviceInfo, FileRef, LayerProfile, Profile

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _layer(name: str, **changes) -> LayerProfile:
    fields = dict(
        name=name, kind="Block", fwd_ms=1.5, bwd_ms=3.0, fwd_ms_min=1.4, fwd_ms_max=1.7,
        bwd_ms_min=2.9, bwd_ms_max=3.3, act_bytes=1 << 20, input_bytes=1 << 16, output_bytes=1 << 16,
        input_in_act_bytes=1 << 16, param_count=1000, param_bytes=4000, transient_bytes=123,
    )
    return LayerProfile(**(fields | changes))


def _profile(**changes) -> Profile:
    fields = dict(
        name="gpt", created_at="2026-01-01T00:00:00+00:00", torch_version="2.13.0",
        device=DeviceInfo(type="cpu", name="x86_64", threads=2), dtype="float32", micro_batch_size=4,
        warmup=2, repeats=5, model=FileRef(file="configs/models/gpt.py", sha256="ab" * 32),
        batch_input_bytes=4128, loss_bytes=99, loss_ms=0.5, layers=[_layer("embed"), _layer("blocks.0")],
    )
    return Profile(**(fields | changes))


def test_profile_round_trips_through_json(tmp_path):
    profile = _profile()
    assert Profile.model_validate_json(profile.model_dump_json()) == profile
    path = tmp_path / "p.json"
    io.save_profile(profile, path)
    assert io.load_profile(path) == profile
    assert json.loads(path.read_text())["schema_version"] == PROFILE_SCHEMA_VERSION


def test_unknown_fields_are_rejected_by_name():
    data = _profile().model_dump()
    data["layers"][0]["act_byts"] = 5
    with pytest.raises(ValidationError, match="act_byts"):
        Profile.model_validate(data)
    with pytest.raises(ValidationError, match="colour"):
        DeviceInfo(type="cpu", name="x", colour="red")


def test_profile_invariants():
    with pytest.raises(ValidationError, match="unique"):
        _profile(layers=[_layer("a"), _layer("a")])
    with pytest.raises(ValidationError):
        _profile(layers=[])
    with pytest.raises(ValidationError):
        _profile(micro_batch_size=0)
    with pytest.raises(ValidationError):
        DeviceInfo(type="tpu", name="x")


def test_load_profile_errors_are_one_sentence(tmp_path):
    path = tmp_path / "p.json"
    data = _profile().model_dump()
    data["layers"][0].pop("fwd_ms")
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match=r"field 'layers.0.fwd_ms': Field required.*ckplan profile"):
        io.load_profile(path)
    path.write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        io.load_profile(path)
    path.write_text(json.dumps(data | {"schema_version": PROFILE_SCHEMA_VERSION + 1}))
    with pytest.raises(UserError, match="schema version"):
        io.load_profile(path)
    with pytest.raises(UserError, match="does not exist"):
        io.load_profile(tmp_path / "absent.json")


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "deep" / "p.json"
    io.save_profile(_profile(), path)
    io.save_profile(_profile(name="again"), path)
    assert [p.name for p in path.parent.iterdir()] == ["p.json"]
    assert io.load_profile(path).name == "again"


def test_measured_numbers_are_bounded_at_the_schema():
    from planner.schema import MAX_BYTES, MAX_MS

    # the bounds themselves and zero are measurements; one past them is not
    _profile(layers=[_layer("a", act_bytes=MAX_BYTES, fwd_ms=MAX_MS, transient_bytes=0, bwd_ms=0.0)])
    for changes in ({"act_bytes": MAX_BYTES + 1}, {"fwd_ms": MAX_MS * 1.01}, {"bwd_ms": -1e-9},
                    {"fwd_ms_max": float("nan")}, {"param_bytes": -1}):
        with pytest.raises(ValidationError, match=next(iter(changes))):
            _layer("a", **changes)
    with pytest.raises(ValidationError, match="dtype"):
        _profile(dtype="torch.float64")
    with pytest.raises(ValidationError, match="repeats"):
        _profile(repeats=0)


def test_a_plan_with_an_unknown_dtype_is_refused_at_load(tmp_path):
    import yaml
    from fixtures.rt_plans import make_plan

    path = tmp_path / "plan.yaml"
    io.save_plan(make_plan(ROOT / "tests" / "fixtures" / "tiny.py", [["0", "1", "2"]]), path)
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump(data | {"dtype": "float8"}))
    with pytest.raises(UserError, match=r"field 'dtype' = 'float8': Input should be 'float32', 'bfloat16' or"):
        io.load_plan(path)


def test_a_plan_written_before_the_setup_had_parts_loads_and_scores_the_same(tmp_path):
    """tests/fixtures/plan_v1/plan_v1.yaml was written by `ckplan solve` at schema version 1
    (the setup flat: --dp 2 --zero 1 --offload-optimizer --host-mem 1GiB, 2 stages); it loads
    into the parts, re-scores to its own prediction, and saves as version 2."""
    from planner.cost import costmodel
    from planner.schema import PLAN_SCHEMA_VERSION

    folder = ROOT / "tests" / "fixtures" / "plan_v1"
    plan = io.load_plan(folder / "plan_v1.yaml")
    setup = plan.setup
    assert (setup.pipeline.stages, setup.pipeline.microbatches, setup.pipeline.parallel_stages) == (2, 4, 1)
    assert (setup.data_parallel.dp, setup.data_parallel.zero, setup.data_parallel.offload) == (2, 1, True)
    assert (setup.data_parallel.host_mem_bytes, setup.data_parallel.devices_per_node) == (2**30, 4)
    assert (setup.training.optimizer, setup.training.precision) == ("adam", "fp32")
    assert setup.time.compute_scale == 1.0 and setup.time.calibration is None
    cost = costmodel.evaluate(plan.stages, io.load_profile(folder / "llm.json"), setup)
    assert cost.iteration_ms == pytest.approx(plan.predicted.iteration_ms, rel=1e-12)
    # the prediction predates two terms (docs/published-runs.md §45.boundgrad3): stage 0 (w = 2 warm-ups of M = 4,
    # M - w = 2 >= w - 1 = 1) holds its warm-up send's stage output, + 1 MiB (97,377,536 -> 98,426,112 B); the last
    # stage (k = 1) holds M - k + 2 = 5 loss values of 4 B, + 20 B (58,580,224 -> 58,580,244 B)
    assert [stage.predicted.peak_bytes for stage in plan.stages] == [97_377_536, 58_580_224]
    assert cost.peak_bytes_per_stage == [97_377_536 + (1 << 20), 58_580_224 + 5 * 4]
    io.save_plan(plan, tmp_path / "plan.yaml")
    import yaml

    saved = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    assert saved["schema_version"] == PLAN_SCHEMA_VERSION
    assert set(saved["setup"]) == {"pipeline", "data_parallel", "training", "time", "comm"}
    assert io.load_plan(tmp_path / "plan.yaml") == plan


def test_setup_updates_are_validated_by_part_or_by_name():
    from pydantic import ValidationError

    from planner.schema import TrainSetup

    setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[1, 1])
    assert setup.model_copy(update={"zero": 1, "dp": 2}).data_parallel.zero == 1
    assert setup.model_copy(update={"time": {"compute_scale": 2.0}}).time.compute_scale == 2.0
    with pytest.raises(ValidationError, match="shard_group"):
        setup.model_copy(update={"dp": 4, "shard_group": 3})
    with pytest.raises(ValidationError, match="less than or equal"):
        setup.model_copy(update={"send_gb_per_s": 1e300})  # a plan with iteration_ms .inf once passed
