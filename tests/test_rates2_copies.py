"""AsyncTP's peer copies at the copy engines' published rate (planner/models/copy_engines.py), the ring's
where none is published or the group crosses nodes; hand-computed on 4 chunks."""

import pytest

from planner.cost import comm, costmodel
from planner.models import copy_engines
from planner.models.synthetic import layer, profile_of
from planner.schema import FusedMatmuls, LayerCollective, TrainSetup


def _block(collectives):
    one = layer("block", "block", fwd_ms=10.0, act_mib=1, input_mib=1, param_count=10)
    one = one.model_copy(update={"bwd_ms": 20.0, "collectives": collectives})
    return costmodel.layer_costs(profile_of([one]))[0]


def _setup(**comm_fields) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**40], runtime="torchtitan",
                      comm={"tp": 4, "tp_gb_per_s": 40.0, "tp_overlap": "async-tp", **comm_fields})


def test_the_fused_copies_run_at_the_copy_rate_and_the_unfused_collectives_at_the_ring():
    fused = FusedMatmuls(whole_ms=7.5, chunk_ms=2.0, copy_ms=0.5)
    gather = LayerCollective(kind="all-gather", tensor_bytes=4 * 10**8, fwd=1, fused=fused)
    scatter = LayerCollective(kind="reduce-scatter", tensor_bytes=4 * 10**8, bwd=1)  # not fused
    block = _block([gather, scatter])
    ring = 0.75 * 4e8 / 40e9 * 1e3  # the unfused reduce-scatter over 4 ranks at the ring's 40 GB/s: 7.5 ms
    # copies of 0.1 GB at the ring's 40 GB/s: 2.5 ms each; own chunk [0, 2], copies end 2.5, 5, 7.5, matmuls
    # end 4.5, 7, 9.5: 9.5 + 0.5 (own copy) - 7.5 (the whole matmul) = 2.5
    assert comm.layer_comm_ms(block, 0, _setup()) == pytest.approx(2.5 + ring)
    # at a copy engine's 20 GB/s: copies [0, 5], [5, 10], [10, 15] (step 3's stream free at 7), matmuls
    # [5, 7], [10, 12], [15, 17]: 17 + 0.5 - 7.5 = 10; the reduce-scatter stays at the ring's rate
    assert comm.layer_comm_ms(block, 0, _setup(tp_copy_gb_per_s=20.0)) == pytest.approx(10.0 + ring)
    # without async-tp the copy rate is not read
    plain = _setup(tp_copy_gb_per_s=20.0).model_copy(update={"comm": _setup().comm.model_copy(
        update={"tp_overlap": "none", "tp_copy_gb_per_s": 20.0})})
    assert comm.layer_comm_ms(block, 0, plain) == pytest.approx(2 * ring)


def test_the_copy_rate_is_the_published_one_per_gpu_and_the_ring_elsewhere():
    fields, said = copy_engines.tp_copy_fields("h100-sxm", tp=8, gpus_per_node=8)
    assert fields == {"tp_copy_gb_per_s": 371.6} and "NVIDIA/nccl#1264" in said
    assert copy_engines.tp_copy_fields("h100-96g", tp=4, gpus_per_node=8)[0] == {"tp_copy_gb_per_s": 371.6}
    assert copy_engines.tp_copy_fields("mi300x", tp=8, gpus_per_node=8)[0] == {"tp_copy_gb_per_s": 48.0}
    fields, said = copy_engines.tp_copy_fields("h200", tp=8, gpus_per_node=8)
    assert fields == {} and "no copy-engine rate published for h200" in said
    fields, said = copy_engines.tp_copy_fields("h100-sxm", tp=16, gpus_per_node=8)  # across nodes
    assert fields == {} and "does not lie in one node" in said
    assert not copy_engines.tp_in_one_node(3, 8) and copy_engines.tp_in_one_node(2, 8)


def test_evaluate_and_the_search_set_the_same_copy_rate(tmp_path):
    from click.testing import CliRunner

    from planner.cli import cli
    from planner.schema import Profile
    from planner.solve import jobsearch
    from planner.solve.degrees import Degrees

    out = tmp_path / "p.json"
    args = ["profile", "--arch", "llama3-8b", "--seq-len", "1024", "--micro-batch-size", "1", "--tp", "2", "--sp",
            "--gpu", "h100", "--out", str(out)]
    assert CliRunner().invoke(cli, args).exit_code == 0
    result = CliRunner().invoke(cli, ["evaluate", "--profile", str(out), "--layers-per-stage", "34",
                                      "--ckpt-per-stage", "0", "--microbatches", "2", "--precision", "bf16-mixed",
                                      "--mem", "80GB", "--runtime", "torchtitan", "--tp-overlap", "async-tp",
                                      "--compile", "--time-limit", "10"])
    assert result.exit_code == 0, result.output
    assert "AsyncTP's peer copies at the copy engines' 371.6 GB/s a direction" in " ".join(result.output.split())
    profile = Profile.model_validate_json(out.read_text())
    degrees = Degrees(tp=2, sp=True, pp=1, dp=1, micro_batch_size=1, microbatches=2)
    options = jobsearch.JobOptions(mem_cap_bytes=2**36, gpus_per_node=8, runtime="torchtitan", tp_overlap="async-tp",
                                   training={"compile": True})
    assert jobsearch.job_setup(profile, degrees, options).comm.tp_copy_gb_per_s == 371.6
    plain = jobsearch.JobOptions(mem_cap_bytes=2**36, gpus_per_node=8, runtime="torchtitan")
    assert jobsearch.job_setup(profile, degrees, plain).comm.tp_copy_gb_per_s is None
