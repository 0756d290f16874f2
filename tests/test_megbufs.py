"""Megatron-core's global memory buffer under the TE spec: the output layer (megatron-core's own ColumnParallelLinear
under every spec) all-gathers its sequence-parallel input into get_global_memory_buffer() and keeps it, on the rank
holding the last stage (planner/cost/afterstep.py global_buffer_bytes, holds_last_stage; the record's
output_layer_buffer; framework-facts §160). Hand counts on tiny cases."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from fixtures.cli import run_ok

from planner.cost import afterstep, runtime_megatron, runtimes, te_userbuffers
from planner.errors import UserError
from planner.schema import CommSetup, DeviceInfo, TrainingSetup

MIB = 1 << 20
H100 = DeviceInfo(type="cuda", name="NVIDIA H100 80GB HBM3")
TE = TrainingSetup(runtime="megatron", precision="bf16-mixed")
MODEL = ("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
         "--vocab-size 1024 --micro-batch-size 1 --global-batch-size 8 --bf16 --tensor-model-parallel-size 2 "
         "--pipeline-model-parallel-size 2 --sequence-parallel")


def _profile(*, mbs=2, hidden=512, seq=1024, tp=2, sp=True, cp=1, device=H100):
    model = {"num_heads": 8, "hidden_size": hidden}
    shape = {"model": model, "seq_len": seq, "micro_batch_size": mbs, "tp": tp, "sp": sp, "cp": cp,
             "dtype": "bfloat16"}
    return SimpleNamespace(assumptions=shape, device=device)


def test_the_output_layer_keeps_its_gathered_input_on_the_last_stage_under_sp():
    assert runtimes.of(TE).output_layer_buffer and "layers.py 623-629" in runtimes.of(TE).sources["output_layer_buffer"]
    # G10's shape (seq 1,024, micro-batch 2, hidden 512, TP 2, SP): 1,024 x 2 x 512 x 2 B = 2 MiB, the gathered
    # (s, b, h) in bf16, whatever the heads
    assert afterstep.global_buffer_bytes(TE, _profile(), holds_output=True) == 1024 * 2 * 512 * 2 == 2 * MIB
    # CP 2: the rank's s / 2 tokens gathered over TP
    assert afterstep.global_buffer_bytes(TE, _profile(cp=2), holds_output=True) == 512 * 2 * 512 * 2
    # not on a rank without the output layer, not without SP, not at TP 1, not on cpu
    assert afterstep.global_buffer_bytes(TE, _profile(), holds_output=False) == 0
    assert afterstep.global_buffer_bytes(TE, _profile(sp=False), holds_output=True) == 0
    assert afterstep.global_buffer_bytes(TE, _profile(tp=1), holds_output=True) == 0
    assert afterstep.global_buffer_bytes(TE, _profile(device=DeviceInfo(type="cpu", name="cpu")),
                                         holds_output=True) == 0
    # torchtitan's output is its own (a DTensor-sharded nn.Linear): no such buffer in its record
    titan = TrainingSetup(runtime="torchtitan", precision="bf16-mixed")
    assert afterstep.global_buffer_bytes(titan, _profile(), holds_output=True) == 0
    # what the first forward keeps on the last rank: torch's two workspaces, TE's, and the 2 MiB
    assert afterstep.first_forward_bytes(TE, _profile(), holds_output=True) == 3 * 32 * MIB + 1024 + 2 * MIB


def test_the_last_stage_is_the_last_rank_but_under_a_v_placed_schedule():
    one_f_one_b = SimpleNamespace(schedule="1F1B", stages=4)
    assert [afterstep.holds_last_stage(r, one_f_one_b) for r in range(4)] == [False, False, False, True]
    zbv = SimpleNamespace(schedule="ZBV", stages=4)
    assert [afterstep.holds_last_stage(r, zbv) for r in range(4)] == [True, False, False, False]
    assert not afterstep.holds_last_stage(None, one_f_one_b)  # what every rank keeps


@pytest.fixture
def without_buffer(monkeypatch):
    """The Megatron record with output_layer_buffer off (the caches cleared around it)."""
    record = runtime_megatron.megatron()
    monkeypatch.setattr(runtime_megatron, "megatron", lambda: replace(record, output_layer_buffer=False))
    runtimes.facts.cache_clear()
    runtimes._of.cache_clear()
    yield
    runtimes.facts.cache_clear()
    runtimes._of.cache_clear()


def _evaluate(folder: Path) -> list[dict]:
    path = folder / "launch.sh"
    path.write_text(f"torchrun --nproc-per-node 4 pretrain_gpt.py {MODEL}\n")
    return json.loads(run_ok("evaluate", "--from-megatron", path, "--gpu", "h100", "--json").stdout)["ranks"]


def test_a_launch_holds_the_buffer_after_the_step_and_at_the_peak_on_its_last_rank(tmp_path, request):
    ranks = _evaluate(tmp_path)
    request.getfixturevalue("without_buffer")
    plain = _evaluate(tmp_path)
    buffer = 128 * 1 * 256 * 2  # s x b x h x 2 B: 64 KiB
    assert [r["after_step_bytes"] - p["after_step_bytes"] for r, p in zip(ranks, plain)] == [0, buffer]
    assert [r["peak_bytes"] - p["peak_bytes"] for r, p in zip(ranks, plain)] == [0, buffer]
    assert [r["static_bytes"] - p["static_bytes"] for r, p in zip(ranks, plain)] == [0, 0]
    # by hand after the step on the last rank: its two kept stage inputs (s / TP x b x h x 2 B each, 32 KiB),
    # torch's two workspaces, TE's, and the buffer
    last = ranks[-1]
    assert last["after_step_bytes"] - last["static_bytes"] == 2 * 64 * 256 * 2 + 2 * 32 * MIB + 32 * MIB + 1024 + buffer


# ---- TE's userbuffers' communication buffers, outside torch's allocator (te_userbuffers.buffer_bytes) ----

REGION0 = 4 * (14_400 + 5 * 1024 + 8192 * 32 * 3)  # the communicator's region 0: 3,223,808 B
FLAGS = 2 * 64 * 1024


def _shape(seq, mbs, hidden, cp=1):
    return {"model": {"hidden_size": hidden}, "seq_len": seq, "micro_batch_size": mbs, "cp": cp}


def test_the_communication_buffers_at_bridges_70b_fp8_shape_by_hand():
    fp8 = TrainingSetup(runtime="megatron", precision="bf16-mixed", float8=True)
    comm = CommSetup(tp=4, tp_overlap="tp-comm-overlap", ub_cfg="userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192")
    # 8,192 x 8,192 elements: the eight all-gathers FP8 (64 MiB each), the bulk wgrad reduce-scatters bf16 (128 MiB
    # each), the fprops' ring-exchange reduce-scatters 2 x 4 - 1 = 7 chunks of 128 / 4 MiB (224 MiB each)
    assert te_userbuffers.buffer_bytes(comm, fp8, _shape(8192, 1, 8192)) \
        == (8 * 64 + 2 * 128 + 2 * 224) * MIB + REGION0 + FLAGS == 1216 * MIB + 3_354_880
    # the 405B at CP 2, TP 8 (h100's config): 8,192 / 2 x 16,384 elements, the same 64 Mi; fprops 15 / 8 x 128 MiB
    comm8 = CommSetup(tp=8, tp_overlap="tp-comm-overlap", ub_cfg="userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192")
    assert te_userbuffers.buffer_bytes(comm8, fp8, _shape(8192, 1, 16384, cp=2)) \
        == (8 * 64 + 2 * 128 + 2 * 240) * MIB + REGION0 + FLAGS


def test_the_communication_buffers_under_tes_defaults_and_where_none_are_made():
    bf16 = TrainingSetup(runtime="megatron", precision="bf16-mixed")
    ub = CommSetup(tp=2, tp_overlap="tp-comm-overlap")
    # TE's defaults in bf16: twelve communicators (the fprops' reduce-scatters pipelines: one buffer each), 2 B each
    assert te_userbuffers.buffer_bytes(ub, bf16, _shape(128, 1, 256)) == 12 * 128 * 256 * 2 + REGION0 + FLAGS
    assert te_userbuffers.buffer_bytes(CommSetup(tp=2), bf16, _shape(128, 1, 256)) == 0
    titan = TrainingSetup(runtime="torchtitan", precision="bf16-mixed")
    assert te_userbuffers.buffer_bytes(ub, titan, _shape(128, 1, 256)) == 0
    with pytest.raises(UserError, match="does not record"):
        te_userbuffers.buffer_bytes(ub, bf16, {})


def _launch(folder: Path, overlap: bool) -> dict:
    path = folder / ("on.sh" if overlap else "off.sh")
    model = MODEL.replace("--pipeline-model-parallel-size 2 ", "")
    path.write_text(f"torchrun --nproc-per-node 2 pretrain_gpt.py {model}" + (" --tp-comm-overlap" if overlap else "")
                    + "\n")
    return json.loads(run_ok("evaluate", "--from-megatron", path, "--gpu", "h100", "--json").stdout)["ranks"][0]


def test_a_launch_with_the_overlap_takes_the_buffers_off_the_device_beside_nccls(tmp_path):
    on, off = _launch(tmp_path, True), _launch(tmp_path, False)
    assert on["nccl_buffers"] == off["nccl_buffers"]
    assert on["workspace_bytes"] - off["workspace_bytes"] == 12 * 128 * 256 * 2 + REGION0 + FLAGS


# ---- TE v2.9 (Megatron-Bridge 25.11): the overlapped GEMMs' 3x workspace in place of the plain one ----


def test_te_v29_holds_the_3x_workspace_in_place_of_the_plain_one():
    newer, bridge = runtimes.facts("megatron"), runtimes.facts("megatron", "92c8482e")
    assert newer.te_ub_keeps_plain_workspace and not bridge.te_ub_keeps_plain_workspace
    assert "base.py 85-92" in bridge.sources["te_ub_keeps_plain_workspace"] and "92c8482e" in bridge.version
    on_bridge = TrainingSetup(runtime="megatron", precision="bf16-mixed", runtime_version="92c8482e")
    ub = CommSetup(tp=2, tp_overlap="tp-comm-overlap")
    te = 32 * MIB + 1024
    assert afterstep.te_workspaces(newer, H100, TE, ub) == (te, 3 * te)
    assert afterstep.te_workspaces(bridge, H100, on_bridge, ub) == (3 * te,)
    # without the overlap both keep the one plain workspace
    assert afterstep.te_workspaces(bridge, H100, on_bridge, CommSetup(tp=2)) == (te,)


def test_a_bridge_runs_file_reads_as_bridges_record_and_a_functional_tests_does_not(tmp_path):
    from planner.models.configs import megatron

    flags = ["--num-layers: 2", "--hidden-size: 256", "--num-attention-heads: 4", "--seq-length: 128",
             "--max-position-embeddings: 128", "--vocab-size: 1024", "--bf16: true", "--micro-batch-size: 1"]
    args = "MODEL_ARGS:\n" + "".join(f"  {line}\n" for line in flags)
    bridge, functional = tmp_path / "bridge.yaml", tmp_path / "functional.yaml"
    bridge.write_text(args + "PERF_ENV_VARS:\n  NCCL_NVLS_ENABLE: 0\n")
    functional.write_text("ENV_VARS:\n  CUDA_DEVICE_MAX_CONNECTIONS: 1\n" + args)
    read = megatron.read(bridge)
    assert read.modelled.runtime_version == "92c8482e"
    assert any(note.startswith("runtime version: megatron-core 92c8482e with TransformerEngine v2.9")
               for note in read.notes)
    assert not any("d98e8a64" in note for note in read.notes if note.startswith("runtime version:"))
    assert megatron.read(functional).modelled.runtime_version is None
