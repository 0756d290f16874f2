"""Defects found trying ckplan as a user on models and configs no test used (§43.usertrial6): each one's
command before and after, on a tiny case."""

from __future__ import annotations

from pathlib import Path

from fixtures.cli import run

from planner.models.configs import torchtitan

# torchtitan b5bcd76c torchtitan/models/flux/config_registry.py in the parts that matter: a dataset helper of
# another type assigned before the FluxTrainer.Config the function returns
_FLUX = """from dataclasses import replace
from . import model_registry


def _flux_dataset(dataset_name: str, *, img_size: int) -> SingleDatasetConfig:
    dataset = SingleDatasetConfig(name=dataset_name)
    return replace(dataset, processor=replace(dataset.processor, img_size=img_size))


def flux_dev() -> FluxTrainer.Config:
    training_dataset = _flux_dataset("cc12m-wds", img_size=256)
    return FluxTrainer.Config(loss=MSELoss.Config(), model_spec=model_registry("flux-dev"),
                              training=TrainingConfig(num_tokens_per_microbatch_per_dp_rank=24576),
                              dataloader=GrainDataLoader.Config(dataset=training_dataset))
"""


def test_a_helper_of_another_type_is_a_value_not_the_config_it_refines(tmp_path):
    """flux_dev assigns _flux_dataset(...) (-> SingleDatasetConfig) before returning its FluxTrainer.Config:
    the reader took the helper for the base config and refused its `replace` ("give the file and function
    replace is defined in", dataclasses' own); now the model is read, and FLUX refused for what it is."""
    (tmp_path / "flux").mkdir()
    path = tmp_path / "flux" / "config_registry.py"
    path.write_text(_FLUX)
    result = run("evaluate", "--from-torchtitan", f"{path}:flux_dev", "--gpus", "8")
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and "Traceback" not in result.output and said.count("Error:") == 1
    assert "replace" not in said
    assert "model flux flavor flux-dev" in said and "not a causal language model" in said


def test_a_llama3_config_with_a_dataset_helper_reads_its_model_and_lists_the_helpers_value(tmp_path):
    (tmp_path / "llama3").mkdir()
    path = tmp_path / "llama3" / "config_registry.py"
    path.write_text(_FLUX.replace("FluxTrainer.Config", "Trainer.Config").replace('"flux-dev"', '"8B"')
                    .replace("MSELoss", "CrossEntropyLoss")
                    .replace("num_tokens_per_microbatch_per_dp_rank=24576",
                             "num_tokens_per_microbatch_per_dp_rank=16384, max_context_length=8192"))
    job = torchtitan.read(Path(f"{path}:flux_dev"))
    assert (job.arch.name, job.seq_len, job.micro_batch_size) == ("llama3-8b", 8192, 2)
    said = {s.name: s.status for s in job.settings}
    assert said["dataloader"] == "no effect"


def test_a_helper_returning_the_same_config_is_still_the_base_it_refines(tmp_path):
    (tmp_path / "llama3").mkdir()
    path = tmp_path / "llama3" / "config_registry.py"
    path.write_text("from . import model_registry\n\n\n"
                    "def base() -> Trainer.Config:\n"
                    "    return Trainer.Config(model_spec=model_registry('8B'),\n"
                    "        training=TrainingConfig(num_tokens_per_microbatch_per_dp_rank=8192, max_context_length=8192))\n\n\n"
                    "def longer() -> Trainer.Config:\n"
                    "    config = base()\n"
                    "    config.training.num_tokens_per_microbatch_per_dp_rank = 32768\n"
                    "    return config\n")
    job = torchtitan.read(Path(f"{path}:longer"))
    assert (job.arch.name, job.seq_len, job.micro_batch_size) == ("llama3-8b", 8192, 4)


# Megatron-LM d98e8a64 examples/mimo/scripts/run_hetero_nemotron_20l_mock_train.sh, lines 14 and 25-27 as shipped
_HETERO = """#!/bin/bash
set -euo pipefail
TORCHRUN_LOG_DIR=${TORCHRUN_LOG_DIR:-"${PWD}/logs/torchrun-$(date +%Y%m%d_%H%M%S)-$$"}
mkdir -p "${TORCHRUN_LOG_DIR}"
uv run --extra ssm python -m torch.distributed.run --standalone --nproc-per-node 8 \\
  --log-dir "${TORCHRUN_LOG_DIR}" \\
  -m examples.mimo.pretrain_mimo \\
  --num-layers 20 --hidden-size 2688
"""


def test_a_default_holding_a_braced_expansion_and_a_command_is_read_to_its_own_brace():
    """`${A:-"${PWD}/x-$(date)-$$"}`: bash reads it (bash -n); the reader closed the outer `${` at ${PWD}'s brace and
    refused the script as "'${' is never closed; give a script bash can read"."""
    from planner.models.configs.bashscan import brace_end

    text = 'X=${A:-"${PWD}/l-$(date +%H})-$$"}/tail'
    assert brace_end(text, 2) == len(text) - len("/tail") - 1
    assert brace_end("${A:-'}'}", 0) == 8 and brace_end("${A", 0) == -1
    assert brace_end("${A:-{}", 0) == 6  # a bare '{' opens nothing: bash closes at the first '}'


def test_the_hetero_mimo_script_is_refused_for_what_it_runs(tmp_path):
    """It runs `-m examples.mimo.pretrain_mimo` (a module, through torch.distributed.run): refused as the multimodal
    trainer it is, in one sentence, not for a brace bash reads."""
    path = tmp_path / "run_hetero_nemotron_20l_mock_train.sh"
    path.write_text(_HETERO)
    result = run("evaluate", "--from-megatron", path, "--gpus", "8")
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and "Traceback" not in result.output and said.count("Error:") == 1
    assert "never closed" not in said and "runs pretrain_mimo.py, which trains a multimodal model" in said


def test_a_trainer_run_as_a_module_is_read_as_its_file(tmp_path):
    from planner.models.configs.bashargs import read_script

    script = read_script("torchrun --nproc_per_node 8 -m megatron_lm.pretrain_gpt --num-layers 2 --hidden-size 64\n",
                         "s.sh")
    assert script.trainer == "megatron_lm/pretrain_gpt.py" and script.args == ["--num-layers", "2", "--hidden-size", "64"]
    assert script.launcher_args == ["torchrun", "--nproc_per_node", "8", "-m"]


def test_a_key_set_in_a_section_held_as_written_is_said_beside_it_not_a_traceback(tmp_path):
    """torchtitan b5bcd76c's RL configs set `config.async_loop.batcher = ...` after `async_loop=AsyncLoopConfig(...)`,
    a call the reader holds as its text: `_set` indexed the text ("TypeError: 'str' object does not support item
    assignment", a traceback); now the key is said beside the section's text."""
    (tmp_path / "qwen3").mkdir()
    path = tmp_path / "qwen3" / "config_registry.py"
    path.write_text("from . import model_registry\n\n\n"
                    "def base() -> Trainer.Config:\n"
                    "    return Trainer.Config(model_spec=model_registry('0.6B'), async_loop=AsyncLoopConfig(steps=10),\n"
                    "        training=TrainingConfig(num_tokens_per_microbatch_per_dp_rank=4096, max_context_length=2048))\n\n\n"
                    "def tuned() -> Trainer.Config:\n"
                    "    config = base()\n"
                    "    config.async_loop.target_offpolicy_steps = 0\n"
                    "    return config\n")
    job = torchtitan.read(Path(f"{path}:tuned"))
    said = {s.name: (s.status, s.value) for s in job.settings}
    assert said["async_loop"] == ("unknown", "AsyncLoopConfig(...); .target_offpolicy_steps = 0")
    result = run("evaluate", "--from-torchtitan", f"{path}:tuned", "--gpus", "8")
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output


def test_torchtitans_rl_controller_is_refused_for_what_it_is(tmp_path):
    """torchtitan b5bcd76c experiments/rl/examples/alphabet_sort/config_registry.py returns Controller.Config (a
    PolicyTrainer on TP 2 beside vLLM generators): it was scored as an 8-GPU pretraining job of the model (DP 8, the
    trainer's TP, batch and GRPO loss unread, listed "unknown"), or refused for a model "alphabet_sort"."""
    (tmp_path / "alphabet_sort").mkdir()
    path = tmp_path / "alphabet_sort" / "config_registry.py"
    path.write_text("from torchtitan.models.qwen3 import model_registry\n\n\n"
                    "def rl_grpo() -> Controller.Config:\n"
                    "    return Controller.Config(model_spec=model_registry('0.6B'),\n"
                    "        trainer=PolicyTrainer.Config(parallelism=ParallelismConfig(tensor_parallel_degree=2)))\n\n\n"
                    "def rl_grpo_tuned() -> Controller.Config:\n"
                    "    config = rl_grpo()\n"
                    "    config.async_loop.target_offpolicy_steps = 0\n"
                    "    return config\n")
    for function in ("rl_grpo", "rl_grpo_tuned"):
        result = run("evaluate", "--from-torchtitan", f"{path}:{function}", "--gpus", "8")
        said = " ".join(result.output.split())
        assert result.exit_code != 0 and "Traceback" not in result.output and said.count("Error:") == 1
        assert "returns Controller.Config(...), torchtitan's RL loop" in said and "PolicyTrainer.Config" in said


def test_a_command_or_arithmetic_never_closed_names_the_file_and_line(tmp_path):
    """An unclosed `$(` was refused without saying where ("a '$(' is never closed"); inside a `${...}` default too."""
    from planner.models.configs.bashscan import brace_end, matching

    assert matching("$(date", 1) == -1 and brace_end('${A:-"$(date"}', 0) == -1
    for line, opened in (("N=$(nproc\n", "$("), ("N=$((2 * 4)\n", "$(("), ('D=${A:-"$(date"}\n', "${")):
        path = tmp_path / "train.sh"
        path.write_text("#!/bin/bash\n" + line + "torchrun pretrain_gpt.py --num-layers 2\n")
        result = run("evaluate", "--from-megatron", path, "--gpus", "8")
        said = " ".join(result.output.split())
        assert result.exit_code != 0 and "Traceback" not in result.output
        assert f"{path}, line 2: '{opened}' is never closed" in said, said
