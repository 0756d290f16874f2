"""scripts/replay_trace.py traces a settled replay (allocator.settled_replay: FSDP2's, Megatron-LM's) as the one
sequence it plays: the traced rank's peaks are the replay's."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_megatron_ranks_settled_replay_is_traced_to_the_figure_the_cost_model_replays():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "0"}
    args = ["--from-megatron", "configs/megatron-lm/gpt3_mcore_tp1_pp2.yaml", "--gpus", "8", "--gpu", "h100"]
    run = subprocess.run([sys.executable, "scripts/replay_trace.py", *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    line = re.search(r"^rank 0: (\d+) events, reserved peak ([\d.]+) GiB, allocated peak ([\d.]+) GiB", run.stdout,
                     flags=re.M)
    assert line and int(line[1]) > 0
    stage = json.loads(run.stdout.strip().splitlines()[-1])["stages"][0]
    assert abs(float(line[3]) - stage["peak"]) < 0.001  # the allocated peak the replay plays is the cost model's
    assert float(line[2]) <= stage["reserved"] < float(line[2]) + 0.01  # the replay's reserve, and the rank's extras
