"""A launch script's launcher and rendezvous exports (MASTER_ADDR, RANK, LOCAL_RANK, CUDA_VISIBLE_DEVICES, ...) are
read as what they are, a launcher's variables that move no memory or time (docs/framework-facts.md §447), not listed
as unknown flags the prediction leaves out."""

from fixtures.cli import run

from planner.models.configs import megatron

SCRIPT = """#!/bin/bash
{exports}
torchrun --nproc_per_node 1 pretrain_gpt.py \\
    --num-layers 2 --hidden-size 256 --num-attention-heads 4 --ffn-hidden-size 1024 \\
    --seq-length 512 --max-position-embeddings 512 --micro-batch-size 1 --global-batch-size 8 \\
    --vocab-size 1024 --bf16
"""
LAUNCHER = {"MASTER_ADDR": "localhost", "MASTER_PORT": "6000", "WORLD_SIZE": "8", "RANK": "0", "NODE_RANK": "0",
            "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "0", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}


def _script(tmp_path, exports: dict[str, str]):
    path = tmp_path / "train.sh"
    path.write_text(SCRIPT.format(exports="\n".join(f"export {name}={value}" for name, value in exports.items())))
    return path


def test_each_launcher_variable_is_read_as_of_no_effect_with_its_source(tmp_path):
    job = megatron.read(_script(tmp_path, LAUNCHER))
    said = {s.name: s for s in job.settings if s.name.startswith("export ")}
    assert set(said) == {f"export {name}" for name in LAUNCHER}
    for setting in said.values():
        assert setting.status == "no effect" and "a launcher's variable" in setting.what
        assert "torchrun" in setting.what or "CUDA runtime" in setting.what


def test_evaluate_lists_them_as_of_no_effect_not_as_unknown_flags(tmp_path):
    result = run("evaluate", "--from-megatron", _script(tmp_path, LAUNCHER), "--gpus", "1")
    assert result.exit_code == 0, result.output
    told = " ".join(result.output.split())
    assert "unknown" not in told
    assert f"no effect on the plan ({len(LAUNCHER)}): " + ", ".join(f"export {name}" for name in LAUNCHER) in told
    # a variable no launcher sets stays unknown
    other = run("evaluate", "--from-megatron", _script(tmp_path, {"MY_SETTING": "1"}), "--gpus", "1")
    assert "unknown: 1 flag(s) the prediction leaves out" in " ".join(other.output.split())
