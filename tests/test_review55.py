"""Defects found reviewing what stop 54 merged (docs/published-runs.md §33.review), each pinned where it was."""

from __future__ import annotations

import pytest

from planner.models.configs.megatron_flags import launch_disables_nvls, yaml_extras


@pytest.mark.parametrize("value, disabled, status", [
    ("0", True, "modelled"), (0, True, "modelled"),
    ("1", False, "modelled"), (2, False, "modelled"),  # NVLS on (1) or where the GPU has it (2, NCCL's default)
    ("7", False, "not modelled"),  # no value NCCL documents
])
def test_a_yamls_nvls_setting_is_said_as_the_prediction_reads_it(value, disabled, status):
    """NCCL_NVLS_ENABLE 1 or 2 in a Bridge run's PERF_ENV_VARS is scored with NVLS on (launch_disables_nvls), which
    the cost model charges: the listing says modelled, not 'not modelled; the prediction assumes 0'."""
    data = {"MODEL_ARGS": {"--num-layers": 2}, "PERF_ENV_VARS": {"NCCL_NVLS_ENABLE": value}}
    assert launch_disables_nvls(data) is disabled
    [(name, said, got, what)] = yaml_extras(data)
    assert (name, said, got) == ("PERF_ENV_VARS.NCCL_NVLS_ENABLE", str(value), status)
    assert ("the prediction assumes" in what) is (status != "modelled")


@pytest.mark.parametrize("flag", ["--nccl-nvls-off", "--nccl-ring-simple"])
def test_nccls_launch_settings_on_a_cpu_profile_are_refused(tmp_path, flag):
    """A cpu profile's collectives run on gloo: NCCL's launch settings reach no term there (the plan was written, the
    launch files then exported NCCL_* for a gloo job); refused in one sentence, as --nvlink-domain is."""
    from click.testing import CliRunner
    from export_plans import llm_profile

    from planner import io
    from planner.cli import cli

    io.save_profile(llm_profile(2), tmp_path / "cpu.json")
    args = ["solve", "--profile", str(tmp_path / "cpu.json"), "--stages", "2", "--mem", "1GB", "--runtime", "megatron",
            "--out", str(tmp_path / "plan.yaml")]
    result = CliRunner().invoke(cli, [*args, flag])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert f"{flag} says how NCCL runs a GPU job's collectives, and the profile runs on cpu" in \
        " ".join(result.output.split())
    assert "Traceback" not in result.output and not (tmp_path / "plan.yaml").exists()


def test_a_launch_on_other_hosts_than_the_plan_was_scored_for_is_said(tmp_path):
    """A GB200 plan scored for trays of 4 (comm.gpus_per_node 4) exported with --gpus-per-node 8: the launch runs
    8 processes a host, which the plan's host memory and allocator settings were not scored for; said, not silent.
    The host the plan was scored for, given again, says nothing."""
    from fixtures.cli import run_ok
    from test_gb200tray import _profile

    from planner import io

    io.save_profile(_profile(), tmp_path / "tiny.json")
    plan = tmp_path / "plan.yaml"
    run_ok("solve", "--profile", tmp_path / "tiny.json", "--stages", "2", "--dp", "4", "--microbatches", "4",
           "--mem", "100GB", "--runtime", "torchtitan", "--precision", "bf16-mixed", "--out", plan)
    other = run_ok("export", plan, "--to", "torchrun", "--gpus-per-node", "8", "--out", tmp_path / "x.sh")
    said = " ".join(other.output.split())
    assert "--gpus-per-node 8: the plan was scored for hosts of 4 GPUs" in said and "--gpus-per-node 8 to score it" in said
    assert "--nnodes 1 --nproc-per-node 8" in (tmp_path / "x.sh").read_text()  # the given host still wins
    same = run_ok("export", plan, "--to", "torchrun", "--gpus-per-node", "4", "--out", tmp_path / "y.sh")
    assert "scored for hosts" not in same.output


def test_a_plan_scored_under_ring_simple_launches_under_it(tmp_path):
    """--nccl-ring-simple (Megatron-LM's functional tests' NCCL_ALGO=Ring NCCL_PROTO=simple) reaches every launch
    file's environment, as strings in the Kubernetes manifest; a plan scored without it sets neither."""
    import yaml
    from fixtures.cli import run_ok
    from test_gb200tray import TINY

    from planner import io
    from planner.models import archs
    from planner.profiler.analytic import Shape, analytic_profile
    from planner.schema import FileRef

    io.save_profile(analytic_profile(TINY, Shape(seq_len=256, micro_batch_size=1), gpu=archs.gpu("h100"),
                                     model=FileRef(file="arch:tiny-llama", sha256="0" * 64)), tmp_path / "tiny.json")
    base = ("solve", "--profile", tmp_path / "tiny.json", "--stages", "2", "--dp", "4", "--microbatches", "4",
            "--mem", "80GB", "--runtime", "megatron", "--precision", "bf16-mixed")
    run_ok(*base, "--nccl-ring-simple", "--nccl-nvls-off", "--out", tmp_path / "ring.yaml")
    run_ok(*base, "--out", tmp_path / "plain.yaml")
    for name in ("ring", "plain"):
        for target in ("slurm", "kubernetes"):
            run_ok("export", tmp_path / f"{name}.yaml", "--to", target, "--entry", "train.py")
    slurm = (tmp_path / "ring.slurm.sh").read_text()
    assert "export NCCL_ALGO=Ring\nexport NCCL_PROTO=simple\nexport NCCL_NVLS_ENABLE=0\n" in slurm
    env = yaml.safe_load((tmp_path / "ring.trainjob.yaml").read_text())["spec"]["trainer"]["env"]
    assert env == [{"name": "NCCL_ALGO", "value": "Ring"}, {"name": "NCCL_PROTO", "value": "simple"},
                   {"name": "NCCL_NVLS_ENABLE", "value": "0"}]
    assert "NCCL_" not in (tmp_path / "plain.slurm.sh").read_text()
    assert "env" not in yaml.safe_load((tmp_path / "plain.trainjob.yaml").read_text())["spec"]["trainer"]


def test_a_dp_all_reduce_across_pcie_nodes_takes_pcis_latencies():
    """sizedreduce reads the in-node hardware off the setup's step latency (NCCL's PCI 5.7 µs): 4 B over 16 ranks on
    2 nodes of 8 PCIe GPUs is Tree / LL at 6.8 + 2 ((8 - 1) x 1.0 + 1 x 5.0) = 30.8 µs (tuning.cc's PCI hwLat), not
    NVLink's 25.2; LL128 is not run over PCI."""
    from planner.cost import nccltuner, sizedreduce
    from planner.schema import TrainSetup

    setup = TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**50], precision="bf16-mixed",
                       dp=16, zero=0, shard_gb_per_s=48.0, gpus_per_node=8, tp_step_latency_ms=5.7e-3,
                       nccl_capability=90, nccl_nics_per_gpu=1)
    algorithm, protocol, ms = sizedreduce.tuned_all_reduce(4, 16, setup, 48.0)
    channels, speed = nccltuner.graph_channels(48.0, 8, 90)
    assert (algorithm, protocol) == ("Tree", "LL")
    assert ms == pytest.approx(nccltuner.all_reduce_time_us("Tree", "LL", 4, 16, 2, channels, speed, "hopper",
                                                            intra="pcie", ll128=False) / 1e3)
    assert 30.8e-3 < ms < 30.9e-3


def test_the_setups_carry_the_gpu_ncclsized_tunes_for(tmp_path):
    """The sized all-reduce's tuner runs only where the setup names the GPU (nccl_capability, nccl_nics_per_gpu):
    solve's setup takes it from the profile's GPU and --nics-per-gpu, search's (jobsearch.job_setup) from the GPU."""
    from fixtures.cli import run_ok
    from test_gb200tray import TINY

    from planner import io
    from planner.models import archs
    from planner.profiler.analytic import Shape, analytic_profile
    from planner.schema import FileRef
    from planner.solve import jobsearch
    from planner.solve.degrees import Degrees

    profile = analytic_profile(TINY, Shape(seq_len=256, micro_batch_size=1), gpu=archs.gpu("h100"),
                               model=FileRef(file="arch:tiny-llama", sha256="0" * 64))
    io.save_profile(profile, tmp_path / "tiny.json")
    run_ok("solve", "--profile", tmp_path / "tiny.json", "--stages", "1", "--dp", "16", "--microbatches", "1",
           "--mem", "80GB", "--precision", "bf16-mixed", "--nics-per-gpu", "2", "--out", tmp_path / "plan.yaml")
    data = io.load_plan(tmp_path / "plan.yaml").setup.data_parallel
    assert (data.nccl_capability, data.nccl_nics_per_gpu) == (90, 2.0)
    degrees = Degrees(tp=1, sp=False, pp=1, dp=16, micro_batch_size=1, microbatches=1)
    searched = jobsearch.job_setup(profile, degrees, jobsearch.JobOptions(mem_cap_bytes=2**36, gpus_per_node=8))
    assert (searched.data_parallel.nccl_capability, searched.data_parallel.nccl_nics_per_gpu) == (90, 1.0)


def _mesh(**fields):
    from planner.schema import TrainSetup

    base = dict(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**50], precision="bf16-mixed",
                runtime="megatron", shard_gb_per_s=100.0, replica_gb_per_s=100.0, ep_gb_per_s=100.0, gpus_per_node=8)
    return TrainSetup(**(base | fields))


def test_nccls_ctas_place_the_data_parallel_group_tp_apart():
    """The data-parallel group's ranks lie tp apart (the expert-data-parallel group's tp x ep), as
    nccl_buffers.rank_communicators places them: ZeRO 3 over dp 4 at tp 4 on H100 nodes of 8 spans 2 nodes, so its
    gathers and reductions run the network ring's 2 x 8 NICs = 16 CTAs (nccl_sms.network_ring_channels), not the
    in-node ring's 24 a group of 4 ranks side by side would; MoE at dp 8, ep 2, tp 2: the dense group (8 ranks, 2
    apart) and the experts' (4 ranks, 4 apart) both span 2 nodes, 16 each. Of the H100's 132 SMs."""
    from types import SimpleNamespace

    from planner.cost import nccl_buffers, nccl_sms
    from planner.models import archs

    gpu, sms = archs.gpu("h100-sxm"), 132
    assert nccl_buffers.ring_channels(nccl_buffers.NCCL_GPUS["h100-sxm"]) == 24  # inside a node
    assert nccl_sms.network_ring_channels(8, 90) == 16
    dense = _mesh(dp=4, zero=3, tp=4)
    assert [nccl_sms.gpu_share(gpu, sms, dense, which, 10**8) for which in ("gather", "reduce")] == [16 / 132] * 2
    assert nccl_sms.gpu_share(gpu, sms, _mesh(dp=4, zero=3, tp=2), "gather", 10**8) == 24 / 132  # 8 GPUs: one node
    layer = SimpleNamespace(param_count=3 * 10**8, expert_param_count=2 * 10**8, float8_param_count=0)
    moe = _mesh(dp=8, ep=2, zero=3, tp=2)
    assert nccl_sms.layers_shares(gpu, sms, moe, [layer]) == pytest.approx((16 / 132, 16 / 132))


def test_the_experts_all_reduce_is_tuned_over_the_nodes_its_group_spans():
    """DDP's reduction of the routed experts' gradients runs in the expert-data-parallel group, whose ranks lie
    tp x ep apart: at dp 16, ep 8 on H100 nodes of 8 its 2 ranks lie in 2 nodes, so NCCL's tuner times it
    (sizedreduce, across nodes), not the ring's bandwidth term of a group inside one node."""
    from planner.cost import dataparallel, sizedreduce

    setup = _mesh(dp=16, ep=8, zero=0, nccl_capability=90, nccl_nics_per_gpu=1, shard_gb_per_s=46.08)
    experts = dataparallel.expert_setup(setup)
    held = dataparallel.held_expert_params(8 * 10**6, setup)
    grads = held * dataparallel.param_bytes(experts).grads
    dense = dataparallel.grad_reduce_ms(10**6, setup)
    _, reduce = dataparallel.collectives_ms(9 * 10**6, setup, expert_count=8 * 10**6)
    tuned = sizedreduce.tuned_all_reduce(grads, 2, experts, 46.08, stride=8)
    assert tuned[0] != "Ring" or tuned[1] != "Simple" or tuned[2] > 2 * 1 / 2 * grads / 46.08e9 * 1e3
    assert reduce == pytest.approx(dense + tuned[2])


def test_a_slurm_launch_places_its_nodes_in_the_nvlink_domain_the_plan_was_scored_with(tmp_path):
    """A GB200 plan on 2 trays was scored with both in one NVLink domain (72): the Slurm script asks for them in one
    segment (#SBATCH --segment=2, as Megatron-Bridge's executor does on 4-GPU hosts); an H100 plan, each host its own
    domain, asks nothing."""
    from fixtures.cli import run_ok
    from test_gb200tray import TINY, _profile

    from planner import io
    from planner.models import archs
    from planner.profiler.analytic import Shape, analytic_profile
    from planner.schema import FileRef

    h100 = analytic_profile(TINY, Shape(seq_len=256, micro_batch_size=1), gpu=archs.gpu("h100"),
                            model=FileRef(file="arch:tiny-llama", sha256="0" * 64))
    for name, profile in (("gb200", _profile()), ("h100", h100)):
        io.save_profile(profile, tmp_path / f"{name}.json")
        run_ok("solve", "--profile", tmp_path / f"{name}.json", "--stages", "2", "--dp", "8", "--microbatches", "4",
               "--mem", "70GB", "--runtime", "torchtitan", "--precision", "bf16-mixed", "--out", tmp_path / f"{name}.yaml")
        run_ok("export", tmp_path / f"{name}.yaml", "--to", "slurm")
    gb200 = (tmp_path / "gb200.slurm.sh").read_text()
    assert "#SBATCH --nodes=4\n" in gb200 and "domains of 4 hosts: its nodes in blocks of one\n#SBATCH --segment=4\n" in gb200
    assert gb200.index("#SBATCH --segment") < gb200.index("set -euo pipefail")  # sbatch reads directives first
    assert "--segment" not in (tmp_path / "h100.slurm.sh").read_text()
