"""A GB200 host (compute tray) runs 4 GPUs; 18 trays share one NVLink domain of 72 (planner/models/topology.py,
docs/framework-facts.md §145): a collective's link by the domain (or --nvlink-domain, the block a job is placed in),
launches and host memory by the host."""

from __future__ import annotations

import pytest
import yaml
from fixtures.cli import run, run_ok

from planner import io
from planner.cost import costmodel, fsdp2work, links
from planner.errors import UserError
from planner.models import archs, topology
from planner.profiler.analytic import Shape, analytic_profile
from planner.schema import FileRef, TrainSetup

GB200, H100 = archs.gpu("gb200"), archs.gpu("h100")
TINY = archs.Arch(name="tiny-llama", hidden_size=256, intermediate_size=704, num_layers=4, num_heads=4,
                  num_kv_heads=2, vocab_size=2048, tie_word_embeddings=False, max_position_embeddings=1024)


def _profile():
    return analytic_profile(TINY, Shape(seq_len=256, micro_batch_size=1), gpu=GB200,
                            model=FileRef(file="arch:tiny-llama", sha256="0" * 64))


@pytest.fixture(scope="module")
def gb200_plan(tmp_path_factory):
    """A torchtitan plan of the tiny model on 8 GB200s: 2 stages x dp 4."""
    folder = tmp_path_factory.mktemp("gb200")
    io.save_profile(_profile(), folder / "tiny.json")
    run_ok("solve", "--profile", folder / "tiny.json", "--stages", "2", "--dp", "4", "--microbatches", "4",
           "--mem", "100GB", "--runtime", "torchtitan", "--precision", "bf16-mixed", "--out", folder / "plan.yaml")
    return folder / "plan.yaml"


def test_a_gb200_host_is_a_tray_of_4_in_a_domain_of_72():
    assert (topology.host_gpus(GB200, None), topology.nvlink_domain(GB200, None, None)) == (4, 72)
    assert topology.nvlink_domain(GB200, None, 64) == 64  # Megatron-Bridge's blocks of 16 trays
    assert topology.nvlink_domain(GB200, 4, None) == 72  # --gpus-per-node 4 says the host, not the domain
    # a DGX: the host is the domain, and a smaller host is its own
    assert (topology.host_gpus(H100, None), topology.nvlink_domain(H100, None, None)) == (8, 8)
    assert topology.nvlink_domain(H100, 4, None) == 4


@pytest.mark.parametrize("host, domain, said", [
    (None, 66, "--nvlink-domain 66 is not a whole number of hosts of 4 GPUs"),
    (5, None, "gb200's NVLink domain of 72 GPUs is not a whole number of hosts of 5 GPUs"),
    (8, 4, "--nvlink-domain 4 is not a whole number of hosts of 8 GPUs"),
])
def test_a_domain_of_part_hosts_is_refused(host, domain, said):
    with pytest.raises(UserError, match=said):
        topology.nvlink_domain(GB200, host, domain)


def test_the_domain_not_the_host_places_a_shard_groups_ring():
    profile = _profile()
    # 16 ranks in the rack's domain: NVLink, at the measured ring busbw; the host memory shared by a tray's 4
    inside = links.default_links(profile, stages=1, dp=16, shard_group=16)
    assert (inside.shard_gb_per_s, inside.devices_per_node) == (679.6, 4)
    assert links.default_links(profile, stages=1, dp=16, shard_group=16, gpus_per_node=4).shard_gb_per_s == 679.6
    # in domains of 8: two of them, 8 ranks each, the ring over their 8 NICs at 0.96 of 400 Gb/s: 8 x 48 GB/s
    split = links.default_links(profile, stages=1, dp=16, shard_group=16, nvlink_domain=8)
    assert (split.shard_gb_per_s, split.devices_per_node) == (pytest.approx(8 * 50.0 * 0.96), 4)


def _fsdp(**comm) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**50], precision="bf16-mixed",
                      runtime="torchtitan", runtime_version="9dec370", dp=128, zero=3, shard_gb_per_s=100.0,
                      replica_gb_per_s=100.0, **comm)


def test_an_fsdp_rings_steps_cross_the_network_between_domains_not_hosts():
    # 128 ranks in domains of 8 (hosts of 4): 127 steps, 15 across: 8.4 + 112 x 3.4 + 15 x 14.0 µs
    assert fsdp2work.unit_latency_ms(_fsdp(gpus_per_node=4, nvlink_domain=8))[0] == pytest.approx(0.5992)
    # each host its own domain: 32 of them, 31 steps across
    assert fsdp2work.unit_latency_ms(_fsdp(gpus_per_node=4))[0] == pytest.approx((8.4 + 96 * 3.4 + 31 * 14.0) / 1e3)


def test_a_gb200_plan_runs_4_processes_a_host(gb200_plan):
    comm = io.load_plan(gb200_plan).setup.comm
    assert (comm.gpus_per_node, comm.nvlink_domain) == (4, 72)
    run_ok("export", gb200_plan, "--to", "torchrun")
    # the script names its folder (pytest's tmp path may hold "72"): the domain is nowhere else in it
    lines = gb200_plan.with_name("plan.torchrun.sh").read_text().replace(str(gb200_plan.parent), "")
    assert lines.count("torchrun --nnodes 2 --nproc-per-node 4 --node-rank") == 2 and "72" not in lines
    run_ok("export", gb200_plan, "--to", "slurm")
    slurm = gb200_plan.with_name("plan.slurm.sh").read_text()
    assert "#SBATCH --nodes=2\n" in slurm and "#SBATCH --gpus-per-node=4\n" in slurm
    run_ok("export", gb200_plan, "--to", "kubernetes")
    trainer = yaml.safe_load(gb200_plan.with_name("plan.trainjob.yaml").read_text())["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 4)
    # a given --gpus-per-node wins
    run_ok("export", gb200_plan, "--to", "torchrun", "--gpus-per-node", "8", "--out", gb200_plan.with_name("x.sh"))
    assert "--nnodes 1 --nproc-per-node 8" in gb200_plan.with_name("x.sh").read_text()


def test_the_plan_scores_as_one_read_by_its_domain_alone(gb200_plan):
    """The plan's setup (host 4, domain 72) against the same links read as one node of 72 (a plan made before the
    two facts were split): every figure the same, none read from the host; each tray its own domain moves the sends."""
    plan = io.load_plan(gb200_plan)
    profile = _profile()
    now = costmodel.evaluate(plan.stages, profile, plan.setup)

    def with_comm(**fields):
        return plan.setup.model_copy(update={"comm": plan.setup.comm.model_copy(update=fields)})

    before = costmodel.evaluate(plan.stages, profile, with_comm(gpus_per_node=72, nvlink_domain=None))
    assert now.iteration_ms == before.iteration_ms
    assert [s.peak_bytes for s in now.stages] == [s.peak_bytes for s in before.stages]
    trays = costmodel.evaluate(plan.stages, profile, with_comm(nvlink_domain=4))  # stage 0 on ranks 0-3, 1 on 4-7
    assert trays.iteration_ms > now.iteration_ms


@pytest.mark.parametrize("extra, said", [
    (["--nvlink-domain", "6"], "--nvlink-domain 6 is not a whole number of hosts of 4 GPUs"),
    (["--gpus-per-node", "5"], "gb200's NVLink domain of 72 GPUs is not a whole number of hosts of 5 GPUs"),
])
def test_solve_refuses_a_domain_of_part_hosts(tmp_path, extra, said):
    io.save_profile(_profile(), tmp_path / "tiny.json")
    result = run("solve", "--profile", tmp_path / "tiny.json", "--stages", "2", "--mem", "100GB", "--out",
                 tmp_path / "plan.yaml", *extra)
    assert result.exit_code == 1 and said in " ".join(result.output.split())
    assert not (tmp_path / "plan.yaml").exists()


def test_a_domain_for_a_cpu_profile_is_refused(tmp_path):
    from export_plans import llm_profile

    profile = llm_profile(2)
    assert profile.device.type == "cpu"
    io.save_profile(profile, tmp_path / "cpu.json")
    result = run("solve", "--profile", tmp_path / "cpu.json", "--stages", "2", "--mem", "1GB", "--nvlink-domain", "8",
                 "--out", tmp_path / "plan.yaml")
    assert result.exit_code == 1 and "--nvlink-domain places collectives on GPUs' NVLink" in result.output
