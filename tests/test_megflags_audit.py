"""Every flag, key and variable of the Megatron configs ckplan ships is classified by the reader (modelled, no
effect, not modelled, or a reasoned unknown such as a misspelt ds_config key), none left at the generic "not a flag
this reader knows" (issue 33; planner/models/configs/megatron_audit.py, scripts/megatron_flag_audit.py)."""

from __future__ import annotations

from pathlib import Path

from planner.models.configs.megatron_audit import FlagRow, audit, config_files

ROOT = Path(__file__).resolve().parent.parent


def test_every_flag_of_a_shipped_config_is_classified():
    paths = config_files(ROOT)
    assert len(paths) >= 30  # the three folders' files (a userbuffers cfg left out)
    rows, refused = audit(paths, ROOT)
    assert not [(r.name, r.files[0]) for r in rows if not r.classified]
    assert all(why for why in refused.values())  # a refused file says why in one sentence
    read = {f for r in rows for f in r.files}
    assert len(read) + len(refused) == len(paths)


def test_gpt_oss_flags_are_said_as_the_code_does():
    path = ROOT / "configs/megatron-bridge/b200_gptoss_120b_bf16.yaml"
    rows, _ = audit([path], ROOT)
    status = {r.name: r.status for r in rows}
    assert status["--softmax-type"] == "modelled"
    assert status["--glu-linear-offset"] == "no effect"
    assert status["--moe-router-force-load-balancing"] == "modelled"


def test_the_generic_unknown_sentence_is_what_makes_a_flag_unclassified():
    assert not FlagRow("--x", "unknown", "not a flag this reader knows: if it changes memory or time, ...").classified
    assert FlagRow("ds_config k", "unknown", "not a key of DeepSpeed's zero_optimization: v0.6.2 ignores it").classified
    assert FlagRow("--x", "not modelled", "anything").classified


def test_a_flag_the_reader_does_not_know_is_unclassified_and_the_script_fails(tmp_path, capsys):
    import importlib.util

    path = tmp_path / "new.yaml"
    path.write_text("MODEL_ARGS:\n  --num-layers: 2\n  --hidden-size: 64\n  --num-attention-heads: 4\n"
                    "  --seq-length: 128\n  --vocab-size: 512\n  --frobnicate-kv: 3\n")
    rows, refused = audit([path], ROOT)
    assert not refused and [r.name for r in rows if not r.classified] == ["--frobnicate-kv"]
    spec = importlib.util.spec_from_file_location("megatron_flag_audit", ROOT / "scripts/megatron_flag_audit.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main([str(path)]) == 1
    assert "| `--frobnicate-kv` | UNCLASSIFIED | 1: new |" in capsys.readouterr().out
