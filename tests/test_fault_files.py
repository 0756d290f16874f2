"""Files that once hung ckplan or ended in a traceback: every one a sentence, a non-zero exit,
and nothing written."""

import json
import os

import pytest
import yaml
from fixtures.cli import run

from planner import io


@pytest.fixture()
def files(tmp_path):
    """A good profile and plan to break, and a calibration beside the profile."""
    from export_plans import write

    profile, plan, plan_path = write(tmp_path, [4, 3, 3], set())
    return tmp_path / "llm.json", plan_path


def deep_json(levels: int) -> str:
    return "[" * levels + "]" * levels


def alias_bomb(levels: int = 12, width: int = 10) -> str:
    """Each level a list of `width` aliases of the one before: width ** levels nodes expanded."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def merge_bomb(levels: int = 30) -> str:
    """`<<:` chains: each mapping merges the two before it."""
    lines = ["m0: &m0 {k0: 0}", "m1: &m1 {k1: 1}"]
    lines += [f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 2}], k{i}: {i}}}" for i in range(2, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("command, text, sentence", [
    ("solve", deep_json(100_000), "nests deeper than any ckplan file"),
    ("solve", '{"schema_version": 1, "name": ' + "9" * 5000 + "}", "holds a value JSON readers refuse"),
    ("solve", '{"schema_version": 1, "layers": ' + deep_json(5000) + "}", "nests deeper"),
])
def test_malformed_profiles(tmp_path, command, text, sentence):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    out = tmp_path / "plan.yaml"
    result = run("solve", "--profile", str(bad), "--stages", "2", "--mem", "1GB", "--out", str(out))
    assert result.exit_code == 1 and sentence in result.output, result.output
    assert not out.exists()


@pytest.mark.parametrize("text, sentence", [
    (alias_bomb(), "expands (through its aliases) to more than"),
    (merge_bomb(), "expands (through its aliases) to more than"),
    ("a: " + "[" * 50_000 + "]" * 50_000, "nests deeper"),
])
def test_plans_that_expand_or_nest_without_end_are_refused_at_once(tmp_path, text, sentence):
    bad = tmp_path / "plan.yaml"
    bad.write_text(text)
    result = run("export", str(bad), "--to", "megatron")
    assert result.exit_code == 1 and sentence in result.output, result.output[-300:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"]


def test_a_plan_with_a_few_aliases_still_loads(files):
    """What a YAML writer may emit for repeated objects (anchors and aliases) is fine."""
    _, plan_path = files
    data = yaml.safe_load(plan_path.read_text())
    text = yaml.safe_dump(data, sort_keys=False)
    caps = data["setup"]["pipeline"]["mem_caps_bytes"]
    assert io.parse_yaml(text.replace("mem_caps_bytes:", "mem_caps_bytes: &caps", 1), plan_path, "") == data
    assert caps


def test_files_far_larger_than_any_real_one_are_refused_before_reading(tmp_path, monkeypatch):
    big = tmp_path / "huge.json"
    with open(big, "wb") as handle:  # sparse: no disk spent
        handle.truncate(io.MAX_FILE_BYTES + 1)
    result = run("solve", "--profile", str(big), "--stages", "2", "--mem", "1GB", "--out", str(tmp_path / "p.yaml"))
    assert result.exit_code == 1 and "far larger than any ckplan profile" in result.output
    assert os.path.getsize(big) == io.MAX_FILE_BYTES + 1


def test_a_calibration_with_deep_nesting_or_a_huge_integer(files):
    from planner.commands.calibration import calibration_path, load_calibration
    from planner.errors import UserError

    profile_path, _ = files
    path = calibration_path(profile_path)
    for text, sentence in [(deep_json(100_000), "nests deeper"), ('{"send_latency_ms": ' + "1" * 5000 + "}",
                                                                    "JSON readers refuse")]:
        path.write_text(text)
        with pytest.raises(UserError, match=sentence):
            load_calibration(path)


def test_an_arch_config_with_deep_nesting_or_a_huge_integer(tmp_path):
    for text, sentence in [(deep_json(100_000), "nests deeper"), ('{"hidden_size": ' + "7" * 5000 + "}",
                                                                    "JSON readers refuse")]:
        config = tmp_path / "config.json"
        config.write_text(text)
        result = run("profile", "--arch-config", str(config), "--seq-len", "8", "--out", str(tmp_path / "p.json"))
        assert result.exit_code == 1 and sentence in result.output, result.output
        assert not (tmp_path / "p.json").exists()


def test_json_of_a_good_profile_round_trips(files):
    profile_path, _ = files
    assert io.load_profile(profile_path).name == json.loads(profile_path.read_text())["name"]


@pytest.mark.parametrize("command", ["solve", "profile"])
def test_a_full_disk_keeps_the_earlier_file_and_leaves_no_temp(files, tmp_path, monkeypatch, command):
    """ENOSPC while the new plan or profile is written: one sentence, the old file intact."""
    import errno

    profile_path, plan_path = files
    target = plan_path if command == "solve" else tmp_path / "out.json"
    target.write_text("the earlier file\n")
    real_fsync = os.fsync

    def full(fd):
        real_fsync(fd)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(io.os, "fsync", full)
    args = (["solve", "--profile", str(profile_path), "--stages", "2", "--mem", "1GB", "--out", str(target)]
            if command == "solve" else ["profile", "--arch", "llama3-8b", "--seq-len", "8", "--out", str(target)])
    result = run(*args)
    assert result.exit_code == 1 and "No space left on device" in result.output and "unchanged" in result.output
    assert target.read_text() == "the earlier file\n"
    assert not [p for p in target.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("args", [
    ["--arch", "llama3-8b", "--seq-len", "100000000000000"],
    ["--arch", "llama3-8b", "--seq-len", "1000000000", "--attention", "eager"],
])
def test_analytic_shapes_past_any_device_get_one_sentence(tmp_path, args):
    out = tmp_path / "p.json"
    result = run("profile", *args, "--out", str(out))
    assert result.exit_code == 1 and "gives numbers no device holds" in result.output, result.output
    assert "http" not in result.output and not out.exists()


def test_an_arch_config_with_huge_sizes_gets_one_sentence(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096 * 10**9, "intermediate_size": 14336,
                                  "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
                                  "vocab_size": 128256, "max_position_embeddings": 8192}))
    result = run("profile", "--arch-config", str(config), "--seq-len", "8", "--out", str(tmp_path / "p.json"))
    assert result.exit_code == 1 and "gives numbers no device holds" in result.output, result.output


def test_time_limit_bounds_the_baselines_on_six_thousand_layers(tmp_path):
    """The baselines' smallest-fitting-ratio scans score thousands of rules on 6,002 layers
    (minutes); --time-limit bounds them with the solve. One evaluate() of 6,002 layers takes
    about a third of a second here, so a few seconds past the limit is the most this may take."""
    import time

    from planner.cost import costmodel
    from planner.models import synthetic
    from planner.schema import TrainSetup
    from planner.solve import baselines

    profile = synthetic.heterogeneous(6_002, seed=0)
    roomy = TrainSetup(stages=4, microbatches=8, micro_batch_size=1, mem_caps_bytes=[2**50] * 4)
    full = max(costmodel.evaluate(baselines.full_checkpointing(profile, roomy), profile, roomy).peak_bytes_per_stage)
    path = tmp_path / "big.json"
    io.save_profile(profile, path)
    started = time.process_time()  # CPU seconds: the wall time grows with the load, the work past the limit does not
    result = run("solve", "--profile", str(path), "--stages", "4", "--microbatches", "8", "--mem",
                 str(int(full * 1.2)), "--time-limit", "2", "--out", str(tmp_path / "plan.yaml"), "--json")
    elapsed = time.process_time() - started
    assert elapsed < 20, f"took {elapsed:.0f} CPU s"  # minutes before the baselines took the deadline
    assert result.exit_code in (0, 1) and "Traceback" not in result.output
    if result.exit_code == 0:  # a baseline scored in time is the plan, marked feasible, not optimal
        assert json.loads(result.stdout)["status"] == "feasible"
    else:
        assert "--time-limit" in result.output
