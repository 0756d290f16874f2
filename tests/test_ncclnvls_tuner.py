"""NVLink SHARP in NCCL's tuner (planner/cost/nccltuner.py, NVIDIA/nccl v2.27.7-1 src/graph/tuning.cc 367-371,
443-448; src/transport/nvls.cc 151-175) and in NCCL's buffers (planner/cost/nccl_buffers.py), and the launch that turns
it off (NCCL_NVLS_ENABLE=0: Megatron-Bridge's executor, Megatron-LM's functional tests; the setting nccl_nvls_off)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from planner.cost import nccl_buffers as nb
from planner.cost import nccltuner
from planner.models.configs import megatron
from planner.models.configs.megatron_flags import launch_disables_nvls

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
H100, GB200 = nb.NCCL_GPUS["h100-sxm"], nb.NCCL_GPUS["gb200"]


def test_nvls_latencies_by_hand():
    """NVLS: NVLink's 25 µs whatever the ranks (set, not added to a base); NVLS Tree: 25 + 2 log2(nodes) x 14 (the
    network's NVLS Tree figure; ppn = 1 takes the Tree's Simple 14 too)."""
    assert nccltuner.all_reduce_latency_us("NVLS", "Simple", 64, 1) == pytest.approx(25.0)
    assert nccltuner.all_reduce_latency_us("NVLS", "Simple", 16, 2) == pytest.approx(25.0 + 18.0)
    assert nccltuner.all_reduce_latency_us("NVLSTree", "Simple", 256, 4) == pytest.approx(25.0 + 2 * 2 * 14.0)
    assert nccltuner.all_reduce_latency_us("NVLSTree", "Simple", 1024, 128) == pytest.approx(25.0 + 2 * 7 * 14.0)
    with pytest.raises(ValueError, match="only under Simple"):
        nccltuner.all_reduce_latency_us("NVLS", "LL", 8, 1)


def test_nvls_wins_from_17_ranks_of_one_domain():
    """One NVLink domain: Ring / LL is 6.6 + 2(n-1) x 0.6, 24.6 at 16 ranks and 25.8 at 17, against NVLS's 25."""
    assert nccltuner.tuned_all_reduce(16, 1, nvls=True) == ("Ring", "LL", pytest.approx(24.6))
    assert nccltuner.tuned_all_reduce(17, 1, nvls=True) == ("NVLS", "Simple", pytest.approx(25.0))
    assert nccltuner.tuned_all_reduce(64, 1, nvls=True) == ("NVLS", "Simple", pytest.approx(25.0))
    assert nccltuner.tuned_all_reduce(64, 1) == ("Ring", "LL", pytest.approx(6.6 + 126 * 0.6))  # NVLS off


def test_nvls_tree_across_domains_and_not_on_nodes_of_8():
    """256 GB200 on 4 NVL72 domains of 64 (rows B6, E1, D1's worlds): NVLS Tree 81 against Tree / LL 6.8 + 2 (63 x 0.6
    + 2 x 5.0) = 102.4; NVLS (not Tree) is off across nodes without CollNet. 1,024 H100 on 128 nodes of 8: Tree / LL's
    85.2 beats NVLS Tree's 221."""
    assert nccltuner.tuned_all_reduce(256, 4, nvls=True) == ("NVLSTree", "Simple", pytest.approx(81.0))
    assert nccltuner.tuned_all_reduce(256, 4) == ("Tree", "LL", pytest.approx(102.4))
    assert nccltuner.enabled_algorithms(4, True) == ("Tree", "Ring", "NVLSTree")
    assert nccltuner.enabled_algorithms(1, True) == ("Tree", "Ring", "NVLS")
    assert nccltuner.tuned_all_reduce(1024, 128, nvls=True) == ("Tree", "LL", pytest.approx(85.2))
    assert nccltuner.tuned_all_reduce(64, 1, "pcie", nvls=True)[0] == "Ring"  # no NVLS graph without NVSwitch


def test_where_a_communicator_runs_nvls():
    assert nccltuner.nvls_supported(multicast=True, local_gpus=3)
    assert not nccltuner.nvls_supported(multicast=True, local_gpus=2)  # nvls.cc 160: gpuCount <= 2
    assert not nccltuner.nvls_supported(multicast=False, local_gpus=8)  # A100: no multicast
    assert not nccltuner.nvls_supported(multicast=True, local_gpus=8, enabled=False)  # NCCL_NVLS_ENABLE=0


def test_a_small_communicators_nvls_buffers_where_the_tuner_picks_it():
    """The world's one-element all-reduces: on 256 GB200 (4 domains) NVLS Tree, so 32 channels x 2 x 1 MiB x 32 heads
    + 2 MiB of credits beside the ring's 32 x 12 MiB; 16 ranks of a domain keep Ring / LL: the ring alone."""
    ring = 32 * 12 * MIB
    assert nb.communicator_bytes(nb.Communicator("world", 256, "small"), GB200, domain=72) == ring + 2050 * MIB
    assert nb.communicator_bytes(nb.Communicator("world", 16, "small"), GB200, domain=72) == ring
    assert nb.communicator_bytes(nb.Communicator("world", 256, "small"), GB200, domain=72, nvls=False) == ring
    assert nb.communicator_bytes(nb.Communicator("dp", 8), GB200, domain=72, nvls=False) == ring


def _setup(*, dp, tp_stride_node=8, nvls_off=False, stages=1):
    return SimpleNamespace(pipeline=SimpleNamespace(stages=stages, chunks=1),
                           data_parallel=SimpleNamespace(dp=dp, shard_group=None, ep=1),
                           comm=SimpleNamespace(gpus_per_node=tp_stride_node, domain=tp_stride_node, pp_stride=0, cp=1),
                           training=SimpleNamespace(runtime="megatron", nccl_nvls_off=nvls_off))


def _profile(gpu, tp):
    return SimpleNamespace(assumptions={"gpu": gpu, "tp": tp}, layers=[SimpleNamespace(expert_param_count=0)],
                           device=SimpleNamespace(type="cuda", name=gpu))


def test_a_data_parallel_group_at_tp_8_has_one_gpu_a_node_so_no_nvls():
    """DP 4 at TP 8 on H100 nodes of 8: one rank of the group a node, so NCCL runs no NVLS for it (before: charged
    16 x 2 x 1 MiB x 4 heads as if its 4 ranks shared a node); TP 8 runs it (8 heads + credits)."""
    got = nb.rank_buffers(0, _setup(dp=4), _profile("h100-sxm", 8))
    assert got["dp"] == 24 * 12 * MIB
    assert got["tp"] == 24 * 12 * MIB + 16 * 2 * MIB * 8 + 2 * MIB
    assert got["world"] == 24 * 12 * MIB  # 32 ranks on 4 nodes: Tree / LL (6.8 + 2 (7 x 0.6 + 2 x 5)) beats NVLS Tree


def test_nccl_nvls_off_drops_every_nvls_buffer():
    got = nb.rank_buffers(0, _setup(dp=64, tp_stride_node=72, nvls_off=True), _profile("gb200", 1))
    assert got == {"dp": 32 * 12 * MIB, "world": 32 * 12 * MIB}
    on = nb.rank_buffers(0, _setup(dp=64, tp_stride_node=72), _profile("gb200", 1))
    assert on == {"dp": 32 * 12 * MIB + 24 * 2 * MIB * 32 + 2 * MIB, "world": 32 * 12 * MIB + 24 * 2 * MIB * 32 + 2 * MIB}


def test_the_launches_that_turn_nvls_off():
    """Megatron-Bridge's executor (PERF_ENV_VARS) and the functional tests' launcher (0 unless ENV_VARS say
    otherwise); a bare MODEL_ARGS file names no launch: NCCL's default (on)."""
    args = {"--num-layers": 2}
    assert launch_disables_nvls({"MODEL_ARGS": args, "PERF_ENV_VARS": {"NCCL_NVLS_ENABLE": "0"}})
    assert launch_disables_nvls({"MODEL_ARGS": args, "ENV_VARS": {"CUDA_DEVICE_MAX_CONNECTIONS": 1}})
    assert not launch_disables_nvls({"MODEL_ARGS": args, "ENV_VARS": {"NCCL_NVLS_ENABLE": 1}})
    assert not launch_disables_nvls({"MODEL_ARGS": args})
    job = megatron.read(ROOT / "configs/megatron-bridge/gb200_70b_fp8cs.yaml")
    assert job.modelled.nccl_nvls_off and not job.modelled.nccl_ring_simple


def _train_setup(*, tp, dp, gpus_per_node, **training):
    from planner.schema import TrainSetup

    return TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**40], precision="bf16-mixed",
                      runtime="megatron", comm={"tp": tp, "gpus_per_node": gpus_per_node, "tp_gb_per_s": 600.0,
                                                "tp_step_latency_ms": 3.4e-3, "collective_latency_ms": 8.4e-3},
                      data_parallel={"dp": dp, "zero": 1}, **training)


def test_stepcomm_charges_nvls_tree_on_gb200_unless_the_launch_turns_it_off():
    """256 GB200 at TP 4 (B6's world, one NVL72 domain a 72 of them): the gradient norm at NVLS Tree's 81 µs; with
    NCCL_NVLS_ENABLE=0 Tree / LL's 102.4; on a GPU without multicast (A100) Tree / LL too."""
    from planner.cost import stepcomm

    on = _train_setup(tp=4, dp=64, gpus_per_node=72)
    assert stepcomm.group_runs_nvls("world", on, _profile("gb200", 4))
    assert stepcomm.step_collectives(on, _profile("gb200", 4))[0][2] == pytest.approx(81.0e-3)
    off = _train_setup(tp=4, dp=64, gpus_per_node=72, nccl_nvls_off=True)
    assert not stepcomm.group_runs_nvls("world", off, _profile("gb200", 4))
    assert stepcomm.step_collectives(off, _profile("gb200", 4))[0][2] == pytest.approx(102.4e-3)
    assert stepcomm.step_collectives(on, _profile("a100-80g", 4))[0][2] == pytest.approx(102.4e-3)
    assert stepcomm.step_collectives(on)[0][2] == pytest.approx(102.4e-3)  # no profile: no GPU, no NVLS


def test_the_cli_setting_drops_the_nvls_buffers(tmp_path):
    """`ckplan evaluate` on 8 H100s (FSDP over one node): the data-parallel group's NVLS buffer (16 channels x 2 x
    1 MiB x 8 heads + 2 MiB of credits) beside its ring's 24 x 12 MiB, gone under --nccl-nvls-off."""
    import json

    from click.testing import CliRunner
    from fixtures.tiny_gpt2 import tiny_gpt2_profile

    from planner.cli import cli

    path = tiny_gpt2_profile(tmp_path, "h100")
    args = ["evaluate", "--profile", str(path), "--layers-per-stage", "4", "--ckpt-per-stage", "0", "--microbatches",
            "3", "--mem", "80GB", "--precision", "bf16-mixed", "--runtime", "torchtitan", "--dp", "8", "--zero", "3",
            "--json"]
    buffers = []
    for extra in ([], ["--nccl-nvls-off"]):
        result = CliRunner().invoke(cli, [*args, *extra])
        assert result.exit_code == 0, result.output
        data, _ = json.JSONDecoder().raw_decode(result.output[result.output.index("{\n"):])
        buffers.append(data["hand"]["stages"][0]["nccl_buffers"])
    assert buffers == [{"dp": 24 * 12 * MIB + 258 * MIB}, {"dp": 24 * 12 * MIB}]


def test_a_sharded_group_across_nodes_holds_nvls_only_for_its_scalars():
    """ZeRO >= 1: reduce-scatters and gathers, for which NCCL runs no NVLS across nodes without CollNet (tuning.cc
    301-304). FSDP over 16 H100s on 2 nodes (8 a node): its norm's scalar takes Tree / LL, so no NVLS; the same
    group inside one node keeps it; on 256 GB200 in 4 domains the tuner picks NVLS Tree for the scalar, so NVLS."""
    ring_h100, ring_gb200 = 24 * 12 * MIB, 32 * 12 * MIB
    assert nb.communicator_bytes(nb.Communicator("dp", 16, "sharded", 8), H100, domain=8) == ring_h100
    assert nb.communicator_bytes(nb.Communicator("dp", 16, "collective", 8), H100, domain=8) == ring_h100 + 258 * MIB
    assert nb.communicator_bytes(nb.Communicator("dp", 8, "sharded", 8), H100, domain=8) == ring_h100 + 258 * MIB
    assert nb.communicator_bytes(nb.Communicator("dp", 256, "sharded", 64), GB200, domain=64) == ring_gb200 + 2050 * MIB
    setup = _setup(dp=16)
    setup.data_parallel.zero = 3
    assert nb.rank_communicators(0, setup, _profile("h100-sxm", 1))[0] == nb.Communicator("dp", 16, "sharded", 8)
    setup.data_parallel.zero = 0  # DDP all-reduces: NVLS Tree may run it
    assert nb.rank_communicators(0, setup, _profile("h100-sxm", 1))[0].kind == "collective"


def test_the_megatron_export_says_nvls_was_scored_off():
    """A plan scored with NVLS off says so in its Megatron-LM export (the environment the launch needs), as it says
    a forced Ring / Simple; a plan scored with NVLS on says nothing of it."""
    from planner.emit import megatron as emit_megatron
    from planner.schema.setup import TrainingSetup

    off = emit_megatron._test_settings(TrainingSetup(nccl_nvls_off=True))
    assert [line for line in off if "NCCL_NVLS_ENABLE" in line] == [
        "# scored with NCCL_NVLS_ENABLE=0 in the launch's environment"]
    assert not any("NCCL_NVLS_ENABLE" in line for line in emit_megatron._test_settings(TrainingSetup()))


def test_the_launch_files_set_the_nccl_environment_the_plan_was_scored_with(tmp_path):
    """A plan scored with NVLS off (or Ring / Simple forced) sets it in every exported launch's environment, whatever
    the framework; a plan scored without them sets neither."""
    from fixtures.cli import run_ok

    from planner import io
    from planner.models import archs
    from planner.profiler.analytic import Shape, analytic_profile
    from planner.schema import FileRef

    tiny = archs.Arch(name="tiny-llama", hidden_size=256, intermediate_size=704, num_layers=4, num_heads=4,
                      num_kv_heads=2, vocab_size=2048, tie_word_embeddings=False, max_position_embeddings=1024)
    io.save_profile(analytic_profile(tiny, Shape(seq_len=256, micro_batch_size=1), gpu=archs.gpu("h100"),
                                     model=FileRef(file="arch:tiny-llama", sha256="0" * 64)), tmp_path / "tiny.json")
    base = ("solve", "--profile", tmp_path / "tiny.json", "--stages", "2", "--dp", "4", "--microbatches", "4",
            "--mem", "80GB", "--runtime", "torchtitan", "--precision", "bf16-mixed")
    run_ok(*base, "--nccl-nvls-off", "--out", tmp_path / "off.yaml")
    run_ok(*base, "--out", tmp_path / "on.yaml")
    for name in ("off", "on"):
        run_ok("export", tmp_path / f"{name}.yaml", "--to", "torchrun")
    assert "export NCCL_NVLS_ENABLE=0" in (tmp_path / "off.torchrun.sh").read_text()
    assert "NCCL_NVLS_ENABLE" not in (tmp_path / "on.torchrun.sh").read_text()
