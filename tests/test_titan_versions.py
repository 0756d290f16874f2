"""The torchtitan versions torchao's float8 benchmarks ran (docs/published-runs.md M11/T4, M12/T5): the
2c8b5947 record (2025-08-08: the loss compiled, a pipeline's last stage keeping its outputs), the 0.0.2
package version refused in one sentence naming the commits, and the config reader dating a file of
each to its record. Hand counts on the tiny LLaMA of tests/test_runtimes.py."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.cost import runtimes
from planner.cost.layers import layer_costs
from planner.cost.rules import loss_kept_bytes, stage_constant_transient_bytes
from planner.errors import UserError
from planner.models import archs
from planner.models.configs import torchtitan
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

TINY = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32)
LOGITS = 2 * 32 * 128 * 2  # micro-batch x seq x vocab x bf16


def setup(**fields) -> TrainSetup:
    base = dict(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**50], precision="bf16-mixed",
                runtime="torchtitan")
    return TrainSetup(**(base | fields))


@pytest.fixture(scope="module")
def tiny():
    return analytic.analytic_profile(TINY, Shape(seq_len=32, micro_batch_size=2), gpu=archs.gpu("h100"),
                                     model=FileRef(file="arch:test", sha256="0" * 64))


def test_2c8b5947_compiles_the_loss_as_the_newer_records_and_9dec370_does_not(tiny):
    """M12's torchtitan (2c8b5947) against M11's (0.0.2 of 2025-03, the 9dec370 facts): under
    --compile the plain loss keeps 2x the logits and peaks at 6x, the compiled one 1x and 2x; the
    logits' own 1x is the loss's (torchtitan deletes them without a pipeline). So the 8B rows differ by 1x kept
    and 3x transient: 4x."""
    assert tiny.layers[-1].output_bytes == LOGITS
    compiled = dict(compile=True)
    for version, kept, transient in (("9dec370", 2, 4), ("2c8b5947", 1, 1), ("b5bcd76c", 1, 1)):
        s = setup(runtime_version=version, **compiled)
        assert loss_kept_bytes(tiny, 0, s) == kept * LOGITS + 4
        assert stage_constant_transient_bytes(tiny, 0, s) == transient * LOGITS
    # eager, every version runs the plain loss
    assert stage_constant_transient_bytes(tiny, 0, setup(runtime_version="2c8b5947")) == 4 * LOGITS


def test_2c8b5947_keeps_the_last_stages_outputs_alone_to_the_steps_end(tiny):
    """torch after pytorch#153383 appends only the last stage's output to output_chunks, and
    torchtitan 2c8b5947 does not yet pass return_outputs=False: at 1F1B over 2 stages and 5
    microbatches the last stage holds 5 - 1 logits past their backward, stage 0 none."""
    from planner.cost.score import stage_cost

    layers = layer_costs(tiny)  # embedding, 2 blocks, head
    pipe = dict(stages=2, microbatches=5, mem_caps_bytes=[2**50] * 2, schedule="1F1B")

    def cost(version, stage):
        mine = layers[:2] if stage == 0 else layers[2:]
        return stage_cost(mine, [0] * len(mine), stage=stage, profile=tiny,
                          setup=setup(runtime_version=version, **pipe))

    assert runtimes.facts("torchtitan", "2c8b5947").outputs_held_to_step_end == "last-stage"
    # b5bcd76c's positions, held with the whole batch on every stage (rules.batch_bytes): an int64 a token,
    # M x 2 x 32 x 8 B = 5 x 512 = 2,560 B on each stage; stage 0 otherwise alike
    positions = 5 * 2 * 32 * 8
    first = [cost(v, 0) for v in ("2c8b5947", "b5bcd76c")]
    assert first[1].buffer_bytes - first[0].buffer_bytes == positions
    last = [cost(v, 1) for v in ("2c8b5947", "b5bcd76c")]
    # and 2c8b5947's torch (2.9.0.dev20250811) leaves each received input's gradient on its buffer to the next
    # step (RuntimeFacts.input_grads_held_to_step_end, rules.held_input_grads): at the last stage's last backward
    # M - min(M, P - s) = 4 of them beside the one it makes, where b5bcd76c's torch (after pytorch#164329) holds none
    held_grads = (5 - 1) * layers[2].input_bytes
    assert last[0].buffer_bytes - last[1].buffer_bytes == (5 - 1) * LOGITS + held_grads - positions
    # every stage's, as bbb1b616's torch kept them: stage 0 holds its M - k = 5 - 2 outputs, one of which 2c8b5947's
    # 1F1B warm-up send already holds (warmupsend.held_send_outputs: w = 2, M - w = 3 >= w - 1 = 1): 3 - 1 = 2 more
    assert cost("bbb1b616", 0).buffer_bytes - first[0].buffer_bytes == (5 - 2 - 1) * layers[1].output_bytes


def test_the_package_version_0_0_2_is_refused_naming_the_commits_it_spans():
    with pytest.raises(UserError, match=r"b889f3d5 \(2024-04-16\) to b461ea82 \(2025-06-05\).*give 9dec370"):
        runtimes.facts("torchtitan", "0.0.2")
    with pytest.raises(UserError, match="give 2c8b5947"):
        runtimes.facts("torchtitan", "0.1.0")
    with pytest.raises(UserError, match="use one of b5bcd76c, 2c8b5947, bbb1b616, 9dec370"):
        runtimes.facts("torchtitan", "0.3.0")


def test_the_package_version_on_the_command_line_is_one_sentence(tmp_path, tiny):
    path = tmp_path / "tiny.json"
    path.write_text(tiny.model_dump_json())
    result = CliRunner().invoke(cli, ["evaluate", "--profile", str(path), "--layers-per-stage", "4",
                                      "--ckpt-per-stage", "0", "--microbatches", "1", "--mem", "80GB",
                                      "--precision", "bf16-mixed", "--runtime", "torchtitan",
                                      "--runtime-version", "0.0.2", "--compile"])
    assert result.exit_code != 0
    assert "torchtitan 0.0.2 is the package version of every commit" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) <= 3


# the [training] tables of torchtitan/models/llama/train_configs/llama3_8b.toml at 54ef4222 (2025-03-12)
# and of torchtitan/models/llama3/train_configs/llama3_8b.toml at 2c8b5947 (2025-08-08), as the
# benchmark scripts ran them (torchao benchmarks/float8/training: --training.compile)
TOML_2025_03 = {"model": {"name": "llama3", "flavor": "8B"},
                "training": {"batch_size": 1, "seq_len": 8192, "max_norm": 1.0, "steps": 1000,
                             "data_parallel_replicate_degree": 1, "data_parallel_shard_degree": -1,
                             "tensor_parallel_degree": 1, "compile": True, "dataset": "c4"},
                "activation_checkpoint": {"mode": "selective", "selective_ac_option": "op"}}
TOML_2025_08 = {"model": {"name": "llama3", "flavor": "8B"},
                "training": {"local_batch_size": 1, "seq_len": 8192, "max_norm": 1.0, "steps": 1000,
                             "compile": True, "dataset": "c4"},
                "parallelism": {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": -1,
                                "tensor_parallel_degree": 1, "pipeline_parallel_degree": 1,
                                "context_parallel_degree": 1},
                "activation_checkpoint": {"mode": "selective", "selective_ac_option": "op"}}


@pytest.mark.parametrize("data, version", [(TOML_2025_03, "9dec370"), (TOML_2025_08, "2c8b5947")])
def test_the_benchmarked_configs_are_dated_to_their_records(data, version):
    job = torchtitan.from_mapping(data, "llama3_8b.toml")
    assert job.modelled.runtime_version == version
    assert any(note.startswith(f"runtime version: torchtitan {version}") for note in job.notes)
    assert job.modelled.op_level_sac


def test_a_compile_section_beside_the_batch_sizes_is_not_dated_to_2c8b5947():
    """[compile] replaced training.compile at 08b8b244 (2025-08-20): such a file is past 2c8b5947's
    span and gets the newest record, saying so."""
    data = {"model": {"name": "llama3", "flavor": "8B"}, "training": {"local_batch_size": 1, "seq_len": 8192},
            "compile": {"enable": True}}
    job = torchtitan.from_mapping(data, "new.toml")
    assert job.modelled.runtime_version is None
    assert any("2c8b5947 the last stage's" in note for note in job.notes)


def test_the_runtime_version_is_said_whole_on_the_command_line(tmp_path):
    """The note names the compile section without brackets the console would take for markup; the
    MI300X benchmark's config (torchtitan 2c8b5947's llama3_8b.toml, compile on) is scored as 2c8b5947."""
    toml = ('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\nseq_len = 8192\n'
            'compile = true\n[parallelism]\ndata_parallel_shard_degree = -1\n'
            '[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "op"\n')
    path = tmp_path / "llama3_8b.toml"
    path.write_text(toml)
    result = CliRunner().invoke(cli, ["evaluate", "--from-torchtitan", str(path), "--gpus", "8", "--gpu", "mi300x"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "runtime version: torchtitan 2c8b5947 (2025-08-08)" in said
    assert "replaced by the compile section at 08b8b244" in said
