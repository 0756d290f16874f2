"""Megatron-core's local spec (Megatron-LM's --transformer-impl local; ckplan's --local-layers): no Transformer
Engine workspace, and DotProductAttention's global buffer kept from the first forward (planner/cost/afterstep.py
global_buffer_bytes; the record's local_spec_buffer), by hand on tiny cases."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fixtures.cli import run

from planner import io
from planner.cost import afterstep, runtimes
from planner.cost.allocator import Alloc
from planner.cost.reserve_megatron import MegatronStatic, first_forward_events
from planner.errors import UserError
from planner.models.configs import megatron
from planner.models.synthetic import uniform_blocks
from planner.schema import DeviceInfo, TrainingSetup

MIB = 1 << 20
H100 = DeviceInfo(type="cuda", name="NVIDIA H100 80GB HBM3")
LOCAL = TrainingSetup(runtime="megatron", precision="bf16-mixed", local_layers=True)
TE = TrainingSetup(runtime="megatron", precision="bf16-mixed")


def _profile(*, mbs=4, heads=8, hidden=512, seq=1024, tp=1, sp=False, device=H100):
    """What global_buffer_bytes reads of a profile: its shape's assumptions and its device."""
    model = {"num_heads": heads, "hidden_size": hidden}
    shape = {"model": model, "seq_len": seq, "micro_batch_size": mbs, "tp": tp, "sp": sp, "dtype": "bfloat16"}
    return SimpleNamespace(assumptions=shape, device=device)


def test_the_buffer_is_the_attention_scores_or_the_gathered_input_whichever_is_larger():
    # G3/G4's shape (gpt3_mcore_tp1_pp2, _pp4): micro-batch 4, 8 heads, s 1,024, bf16: 4 x 8 x 1,024² x 2 B
    assert afterstep.global_buffer_bytes(LOCAL, _profile()) == 4 * 8 * 1024 * 1024 * 2 == 64 * MIB
    # TP 2: the rank's 4 heads; without sequence parallelism nothing is gathered
    assert afterstep.global_buffer_bytes(LOCAL, _profile(tp=2, hidden=8192)) == 4 * 4 * 1024 * 1024 * 2
    # TP 2 with SP, micro-batch 1, h 8,192: the gathered input, 1,024 x 1 x 8,192, over the scores, 1 x 4 x 1,024²
    assert afterstep.global_buffer_bytes(LOCAL, _profile(mbs=1, tp=2, sp=True, hidden=8192)) == 1024 * 8192 * 2
    # Transformer Engine's layers make none; nor does a profile not of a cuda device
    assert afterstep.global_buffer_bytes(TE, _profile()) == 0
    assert afterstep.global_buffer_bytes(LOCAL, _profile(device=DeviceInfo(type="cpu", name="cpu"))) == 0


def test_the_local_spec_makes_torchs_two_workspaces_and_not_transformer_engines():
    record = runtimes.facts("megatron")
    assert afterstep.workspace_bytes(record, H100, LOCAL) == 2 * 32 * MIB
    assert afterstep.workspace_bytes(record, H100) == 2 * 32 * MIB + 32 * MIB + 1024
    # what the first forward keeps: the two workspaces and the 64 MiB buffer, against TE's three workspaces
    assert afterstep.first_forward_bytes(LOCAL, _profile()) == 2 * 32 * MIB + 64 * MIB
    assert afterstep.first_forward_bytes(TE, _profile()) == 3 * 32 * MIB + 1024


def test_a_profile_without_its_shape_is_refused_not_charged_nothing():
    with pytest.raises(UserError, match="does not record"):
        afterstep.global_buffer_bytes(LOCAL, SimpleNamespace(assumptions={}, device=H100))
    flash = _profile()
    flash.assumptions["attention"] = "flash"  # the scores the local spec keeps would not be in its activations
    with pytest.raises(UserError, match="--attention eager"):
        afterstep.global_buffer_bytes(LOCAL, flash)


def test_the_replay_makes_the_buffer_at_the_first_forward_beside_the_workspaces():
    static = MegatronStatic(tensors=(), distributed=False, grad_ratio=2.0, main_ratio=2.0, moment_ratio=2.0,
                            clone_ratio=1.0, rest_bytes=0, workspaces=(32 * MIB, 32 * MIB), global_buffer=64 * MIB)
    assert first_forward_events(static) == [Alloc(("workspace", 0), 32 * MIB), Alloc(("workspace", 1), 32 * MIB),
                                            Alloc(("global_buffer",), 64 * MIB)]


def test_the_reader_models_the_local_spec_and_refuses_it_under_context_parallelism(tmp_path):
    path = tmp_path / "args.yaml"
    flags = ["--num-layers: 2", "--hidden-size: 256", "--num-attention-heads: 8", "--seq-length: 128",
             "--vocab-size: 1024", "--bf16: true", "--micro-batch-size: 2", "--transformer-impl: local"]
    path.write_text("MODEL_ARGS:\n" + "".join(f"  {line}\n" for line in flags))
    job = megatron.read(path)
    assert job.modelled.local_layers and {s.name: s.status for s in job.settings}["--transformer-impl"] == "modelled"
    from planner.commands.evaluate_config import predict

    local = predict(job, gpus=1, gpu_name="h100").cost.stages[0]
    # the same job under Transformer Engine with its unfused attention (the scores kept as the local spec's):
    # after the step, the buffer (2 x 8 x 128² x 2 B) in place of TE's workspace (32 MiB + 1 KiB)
    path.write_text(path.read_text().replace("--transformer-impl: local", "--attention-backend: unfused"))
    te = predict(megatron.read(path), gpus=1, gpu_name="h100").cost.stages[0]
    buffer = 2 * 8 * 128 * 128 * 2
    assert local.after_step_bytes - te.after_step_bytes == buffer - (32 * MIB + 1024)
    assert local.peak_bytes - te.peak_bytes == buffer - (32 * MIB + 1024)
    path.write_text(path.read_text().replace("--attention-backend: unfused",
                                             "--transformer-impl: local\n  --context-parallel-size: 2"))
    with pytest.raises(UserError, match="context parallelism 1 only"):
        megatron.read(path)


def test_local_layers_are_refused_where_the_runtime_has_no_local_spec(tmp_path):
    titan = TrainingSetup(runtime="torchtitan", precision="bf16-mixed", local_layers=True)
    assert any("--transformer-impl local" in line for line in runtimes.refused_settings(titan))
    assert not any("--local-layers" in line for line in runtimes.refused_settings(LOCAL))
    path = tmp_path / "p.json"
    io.save_profile(uniform_blocks(2), path)
    common = ["evaluate", "--profile", path, "--layers-per-stage", "4", "--ckpt-per-stage", "0", "--mem", "80GiB",
              "--precision", "bf16-mixed", "--local-layers"]
    refused = run(*common, "--runtime", "torchtitan")
    assert refused.exit_code != 0 and "Traceback" not in refused.output
    assert "read for --runtime megatron only" in " ".join(refused.output.split())


def test_the_export_says_the_local_spec_to_megatron():
    from planner.emit.megatron import _test_settings

    assert any("--transformer-impl" in line and "local" in line for line in _test_settings(LOCAL))
    assert not any("--transformer-impl" in line for line in _test_settings(TE))
