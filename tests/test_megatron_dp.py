"""Megatron-LM's data-parallel collectives where its DDP issues them (planner/cost/megatron_dp.py), by hand on
tiny cases: buckets of 100M parameters over two layers, the reductions hidden behind the last backward but
the last bucket's, the gathers' chain in the first forward, and the reader's flags."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.cost import megatron_dp, schedules
from planner.cost.layers import LayerCost
from planner.cost.megatron_dp import Bucket
from planner.cost.schedule_time import StageTimes
from planner.schema import TrainSetup

PARAMS = 100_000_000  # a layer's parameters
# a reduce-scatter over 2 ranks of a layer's fp32 gradients (Megatron's main_grad): 1/2 x 4e8 B at 25 GB/s = 8 ms;
# the all-gather of its bf16 weights: 1/2 x 2e8 B = 4 ms
REDUCE_MS, GATHER_MS = 8.0, 4.0


def _layer(name: str, *, fwd_ms: float = 5.0, bwd_ms: float = 10.0) -> LayerCost:
    return LayerCost(name=name, kind="block", fwd_ms=fwd_ms, bwd_ms=bwd_ms, act_bytes=0, input_bytes=0,
                     output_bytes=0, input_in_act_bytes=0, param_count=PARAMS, transient_bytes=0)


def _setup(*, stages: int = 1, chunks: int = 1, microbatches: int = 2, **dp) -> TrainSetup:
    schedule = "interleaved-1F1B" if chunks > 1 else "1F1B"
    return TrainSetup(stages=stages, chunks=chunks, schedule=schedule, microbatches=microbatches, micro_batch_size=1,
                      mem_caps_bytes=[80 << 30] * stages, runtime="megatron", precision="bf16-mixed", dp=2, zero=1,
                      shard_gb_per_s=25.0, replica_gb_per_s=25.0, **dp)


def _one_stage_makespan(setup: TrainSetup, layers: list[LayerCost]) -> float:
    """Two microbatches on one rank, 1F1B's order built (evaluate reads a one-stage schedule in closed form and
    keeps dataparallel's per-layer form there; the side stream shows what that form leaves out): F 10 ms (2 x 5),
    B 20 ms (2 x 10), 60 ms of compute."""
    order = schedules.build_schedule("1F1B", num_ranks=1, num_microbatches=2, num_chunks=1)
    times = [StageTimes(10.0, 10.0, 10.0)]
    return megatron_dp.makespan_ms(order, times, [layers], setup, step_window_ms=[0.0])


def test_a_chunk_is_cut_into_buckets_from_its_last_parameter_back():
    setup = _setup(overlap_grad_reduce=True, bucket_params=PARAMS)
    found = megatron_dp.buckets([_layer("l0"), _layer("l1")], setup, size=PARAMS)
    # the last layer's bucket first: ready when its backward (half the chunk's) is done, used after l0's forward
    assert found == [Bucket(REDUCE_MS, GATHER_MS, 0.5, 0.5), Bucket(REDUCE_MS, GATHER_MS, 1.0, 0.0)]
    # 150M a bucket: the first holds l1 and half of l0, closed where l0's backward ends
    assert megatron_dp.buckets([_layer("l0"), _layer("l1")], setup, size=150_000_000) == [
        Bucket(1.5 * REDUCE_MS, 1.5 * GATHER_MS, 1.0, 0.0), Bucket(0.5 * REDUCE_MS, 0.5 * GATHER_MS, 1.0, 0.0)]
    assert megatron_dp.buckets([_layer("l0"), _layer("l1")], setup, size=None) == [
        Bucket(2 * REDUCE_MS, 2 * GATHER_MS, 1.0, 0.0)]


def test_the_default_bucket_is_megatron_cores():
    assert megatron_dp.bucket_params(_setup(overlap_grad_reduce=True)) == 40_000_000  # max(40M, 1M x 2)
    assert megatron_dp.bucket_params(_setup(overlap_grad_reduce=False)) is None  # one bucket, reduced in finalize


def test_the_last_backward_hides_every_bucket_but_the_last():
    layers = [_layer("l0"), _layer("l1")]
    # l1's bucket is issued 10 ms into the last backward (50 ms) and done at 58; l0's at 60, done at 68
    assert _one_stage_makespan(_setup(overlap_grad_reduce=True, bucket_params=PARAMS), layers) == 68.0
    # one bucket (the chunk's 200M parameters under 250M): issued after the last backward, 16 ms exposed
    assert _one_stage_makespan(_setup(overlap_grad_reduce=True, bucket_params=250_000_000), layers) == 76.0
    # without --overlap-grad-reduce: in finalize, after the last backward, whole
    assert _one_stage_makespan(_setup(overlap_grad_reduce=False), layers) == 76.0


def test_the_first_forward_waits_for_its_first_bucket_and_the_next_hides_behind_its_layers():
    layers = [_layer("l0"), _layer("l1")]
    setup = _setup(overlap_grad_reduce=True, overlap_param_gather=True, bucket_params=PARAMS)
    # l0's gather (4 ms) before the first forward; l1's (4 ms) behind l0's 5 ms forward: all 4 ms later
    assert _one_stage_makespan(setup, layers) == 72.0
    # a forward of 2 ms a layer: l1's gather waited 2 ms more inside the forward
    first, second = Bucket(0.0, GATHER_MS, 1.0, 0.0), Bucket(0.0, GATHER_MS, 0.5, 0.5)
    assert megatron_dp.chain_extension_ms([first, second], forward_ms=4.0) == 2.0
    assert megatron_dp.chain_extension_ms([first, second], forward_ms=10.0) == 0.0


def test_the_step_term_leaves_the_interleaved_collectives_to_the_schedule_and_keeps_1f1bs_per_layer():
    from planner.cost.dataparallel import exposed_comm_ms

    interleaved = {"stages": 2, "chunks": 2, "microbatches": 4}
    assert exposed_comm_ms(PARAMS, _setup(**interleaved, overlap_grad_reduce=True), bwd_ms=100.0) == GATHER_MS
    assert exposed_comm_ms(PARAMS, _setup(**interleaved, overlap_grad_reduce=True, overlap_param_gather=True)) == 0.0
    # one stage a rank: the reduction behind the layer's own last backward (8 - 5 ms shows), the gather after the
    # step whole, or under --overlap-param-gather behind the layer's own forward (4 - 3 ms shows)
    assert exposed_comm_ms(PARAMS, _setup(overlap_grad_reduce=True), fwd_ms=3.0, bwd_ms=5.0) == 3.0 + GATHER_MS
    assert exposed_comm_ms(PARAMS, _setup(overlap_grad_reduce=True, overlap_param_gather=True), fwd_ms=3.0,
                           bwd_ms=5.0) == 3.0 + 1.0
    assert exposed_comm_ms(PARAMS, _setup(overlap_grad_reduce=False), fwd_ms=3.0, bwd_ms=5.0) == REDUCE_MS + GATHER_MS


def test_one_stage_a_rank_exposes_the_first_layers_bucket_whole_where_the_per_layer_form_hid_part():
    from types import SimpleNamespace

    profile = SimpleNamespace(layers=[SimpleNamespace(name="l0"), SimpleNamespace(name="l1")])
    both = _setup(overlap_grad_reduce=True, overlap_param_gather=True)
    # l0: its reduction (8 ms) after the last backward, its gather (4 ms) before the first forward; exposed_comm_ms
    # showed 8 - 5 and 4 - 3 of them: 5 + 3 ms more
    assert megatron_dp.edge_exposed_ms(_layer("l0", fwd_ms=3.0, bwd_ms=5.0), profile, both) == 5.0 + 3.0
    assert megatron_dp.edge_exposed_ms(_layer("l1", fwd_ms=3.0, bwd_ms=5.0), profile, both) == 0.0
    # without the overlaps exposed_comm_ms charged them whole already; interleaved, the schedule places them
    assert megatron_dp.edge_exposed_ms(_layer("l0", fwd_ms=3.0, bwd_ms=5.0), profile,
                                       _setup(overlap_grad_reduce=False)) == 0.0
    assert megatron_dp.edge_exposed_ms(_layer("l0"), profile, _setup(stages=2, chunks=2, microbatches=4,
                                                                     overlap_grad_reduce=True)) == 0.0


def test_interleaved_reductions_are_issued_rank_backwards_after_a_chunks_last_and_gathers_a_chunk_ahead():
    setup = _setup(stages=2, chunks=2, microbatches=4, overlap_grad_reduce=True, overlap_param_gather=True)
    order = schedules.build_schedule("interleaved-1F1B", num_ranks=2, num_microbatches=4, num_chunks=2)
    layers = [[_layer(f"l{k}")] for k in range(4)]
    side = megatron_dp.side_stream(order, layers, [StageTimes(5.0, 5.0, 5.0)] * 4, setup, step_window_ms=[0.0, 0.0])
    for rank in range(2):
        actions = order.actions[rank]
        backs = [i for i, a in enumerate(actions) if a.kind == "B"]
        for stage in order.stages_of(rank):
            last = max(i for i in backs if actions[i].stage == stage and actions[i].microbatch == 3)
            j = backs.index(last) + rank
            at = backs[j] if j < len(backs) else len(actions) - 1
            assert any(issue.ms == REDUCE_MS for issue in side.issues[(rank, at)])
        # chunks 0 and 1 gathered as the step starts, each waited for at its chunk's first forward
        assert [issue.key for issue in side.opening[rank]] == [("AG", s) for s in order.stages_of(rank)]


MODEL = """\
MODEL_ARGS:
  --num-layers: 2
  --hidden-size: 256
  --num-attention-heads: 4
  --seq-length: 128
  --max-position-embeddings: 128
  --vocab-size: 1024
  --micro-batch-size: 1
  --global-batch-size: 4
  --bf16: true
  --use-distributed-optimizer: true
"""


def _evaluate(tmp_path, extra: str) -> dict:
    path = tmp_path / "args.yaml"
    path.write_text(MODEL + extra)
    result = CliRunner().invoke(cli, ["evaluate", "--from-megatron", str(path), "--gpus", "2", "--gpu", "h100",
                                      "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output[result.output.index("{"):])


def test_a_config_without_overlap_grad_reduce_is_charged_its_reductions_exposed(tmp_path):
    from planner.commands.evaluate_config import predict
    from planner.models.configs import megatron

    path = tmp_path / "bare.yaml"
    path.write_text(MODEL)
    assert predict(megatron.read(path), gpus=2, gpu_name="h100").setup.data_parallel.overlap_grad_reduce is False
    bare = _evaluate(tmp_path, "")
    # under --overlap-grad-reduce each layer's reduction hides behind its last backward (one stage: per layer)
    overlapped = _evaluate(tmp_path, "  --overlap-grad-reduce: true\n  --ddp-bucket-size: 100000\n")
    assert overlapped["iteration_ms"] < bare["iteration_ms"]
    settings = {s["name"]: s["status"] for s in overlapped["settings"]}
    assert settings["--overlap-grad-reduce"] == settings["--ddp-bucket-size"] == "modelled"


def test_megatrons_refusals_and_the_options_beside_other_runtimes(tmp_path):
    path = tmp_path / "args.yaml"
    path.write_text(MODEL + "  --overlap-param-gather: true\n")
    result = CliRunner().invoke(cli, ["evaluate", "--from-megatron", str(path), "--gpus", "2", "--gpu", "h100"])
    assert result.exit_code != 0 and "needs --overlap-grad-reduce" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("runtime", ["torchtitan", "ckplan"])
def test_the_ddp_options_belong_to_megatrons_runtime(runtime):
    from planner.commands.ddp_options import check_ddp
    from planner.errors import UserError

    with pytest.raises(UserError, match="Megatron-LM's DDP setting"):
        check_ddp({"overlap_param_gather": True}, runtime=runtime, zero=1, chunks=1)
    check_ddp({"overlap_param_gather": True, "overlap_grad_reduce": True}, runtime="megatron", zero=1, chunks=1)


def test_the_megatron_export_writes_the_ddp_overlap_the_plan_was_scored_with():
    from planner.emit.megatron import _ddp_arguments
    from planner.models.configs import megatron

    setup = _setup(stages=2, chunks=2, microbatches=4, overlap_grad_reduce=True, overlap_param_gather=True,
                   bucket_params=PARAMS, param_gather_with_step=True)
    lines = _ddp_arguments(setup)
    assert lines == ["--overlap-grad-reduce", "--overlap-param-gather", "--overlap-param-gather-with-optimizer-step",
                     "--ddp-bucket-size 100000000"]
    assert _ddp_arguments(_setup()) == ["--overlap-grad-reduce"]  # the record's default, written out
    assert _ddp_arguments(_setup(overlap_grad_reduce=False)) == []
    # read back by --from-megatron as the same settings
    flags = [("--num-layers", ["4"]), ("--hidden-size", ["256"]), ("--num-attention-heads", ["4"]),
             ("--seq-length", ["128"]), ("--vocab-size", ["1024"]), ("--global-batch-size", ["8"]),
             ("--pipeline-model-parallel-size", ["2"]), ("--num-virtual-stages-per-pipeline-rank", ["2"]),
             ("--use-distributed-optimizer", [])] + [(line.split()[0], line.split()[1:]) for line in lines]
    ddp = megatron.from_pairs(flags, "m.sh").modelled.ddp
    assert {key: ddp[key] for key in ("overlap_grad_reduce", "overlap_param_gather", "bucket_params",
                                      "param_gather_with_step")} == {
        "overlap_grad_reduce": True, "overlap_param_gather": True, "bucket_params": PARAMS, "param_gather_with_step": True}
