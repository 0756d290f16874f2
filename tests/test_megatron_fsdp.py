"""Megatron-FSDP's buffers (planner/cost/megatron_fsdp.py, read at megatron-core 92c8482e) by hand on a tiny
model: an embedding and a head of 50M parameters, three blocks of 12.6M of which 12M are Float8 weights, over
4 ranks; and the strategies and settings it does not read, refused or noted."""

from fixtures.cli import run

from planner.cost import dataparallel, gathered, megatron_fsdp
from planner.models.configs import megatron
from planner.models.synthetic import uniform_blocks
from planner.schema import Float8Linears, TrainSetup

M = 10**6
GIB = 2**30


def _profile(gpu: str):
    """uniform_blocks(3) as Megatron-core's GPT: the blocks TransformerLayers (Megatron-FSDP's units)."""
    profile = uniform_blocks(3)
    kinds = ["embedding", "decoder_block", "decoder_block", "decoder_block", "norm+lm_head"]
    fp8 = Float8Linears(param_count=12 * M, fwd_ms=1.0, bwd_ms=2.0)
    layers = [layer.model_copy(update={"kind": kind, "float8": fp8 if kind == "decoder_block" else None})
              for layer, kind in zip(profile.layers, kinds, strict=True)]
    return profile.model_copy(update={"layers": layers, "assumptions": {**profile.assumptions, "gpu": gpu}})


def _setup(stages=1, zero=3, **settings):
    dp = {key: settings.pop(key) for key in ("fsdp_double_buffer", "suggested_communication_unit_size")
          if key in settings}
    setup = TrainSetup(stages=stages, microbatches=2, micro_batch_size=1, mem_caps_bytes=[80 * GIB] * stages)
    return setup.model_copy(update={
        "training": setup.training.model_copy(update={"runtime": "megatron", "precision": "bf16-mixed",
                                                      "float8": True, "fp8_all_gather": True, **settings}),
        "data_parallel": setup.data_parallel.model_copy(update={"dp": 4, "zero": zero, **dp})})


def test_double_buffered_slots_the_edges_gathered_and_the_output_layers_bucket_by_hand():
    profile, setup = _profile("gb200"), _setup(fsdp_double_buffer=True)
    assert megatron_fsdp.runs(setup)
    # the embedding and the head gathered in bf16 to the step: 2 x 50M x 2 B; two slots of a block's weights
    # (12M Float8 at 1 B + 0.6M bf16 at 2 B) and of its fp32 gradient bucket (12.6M x 4 B); the output layer's
    # bucket (50M x 4 B) is its moments' (the head's post-backward, the last block's backward): those layers'
    # extras (planner/cost/megatron_fsdp_moments.py, tests/test_fsdpalloc.py), not this constant
    slots = 2 * (12 * M + 0.6 * M * 2 + 12.6 * M * 4)
    assert megatron_fsdp.buffer_bytes(profile, 0, setup) == 200 * M + slots
    assert gathered.unsharded_bytes(profile, 0, setup) == int(200 * M + slots)  # FSDP2's term replaced


def test_without_double_buffers_the_prefetched_units_and_the_unfused_gradients_on_hopper():
    profile = _profile("h100-sxm")
    # a communication unit of 10M: the prefetch adds units while under 5M: one, so two blocks gathered
    setup = _setup(suggested_communication_unit_size=10 * M, unfused_grad_accumulation=True)
    assert megatron_fsdp.gathered_units([int(12.6 * M)] * 3, setup) == 2
    unit = 12 * M + 0.6 * M * 2
    # the first block's post-backward: the head's bucket, two blocks gathered, its bucket, its bf16 gradients
    # (12.6M x 2 B) and the transpose of its Float8 weights (12M x 1 B) > the head's own (bucket + bf16 gradient)
    block_moment = 50 * M * 4 + 2 * unit + 12.6 * M * 4 + 12.6 * M * 2 + 12 * M
    assert block_moment > 50 * M * 4 + 50 * M * 2
    assert megatron_fsdp.buffer_bytes(profile, 0, setup) == 200 * M + block_moment
    # the default unit: max(1e9, 2 x 12.6M): its 5e8 prefetch takes every block there is
    assert megatron_fsdp.comm_unit_elements([int(12.6 * M)] * 3, _setup()) == 10**9
    assert megatron_fsdp.gathered_units([int(12.6 * M)] * 3, _setup()) == 3


def test_two_stages_the_embedding_on_the_first_the_head_and_its_bucket_on_the_last():
    profile, setup = _profile("gb200"), _setup(stages=2, fsdp_double_buffer=True)
    slots = 2 * (12 * M + 0.6 * M * 2 + 12.6 * M * 4)
    assert megatron_fsdp.buffer_bytes(profile, 0, setup) == 100 * M + slots  # no bucket before the slots' one
    assert megatron_fsdp.buffer_bytes(profile, 1, setup) == 100 * M + slots  # its bucket: the layers' extras


def test_the_float8_shard_is_one_byte_a_weight():
    setup = _setup()
    # bytes_per_param charges the bf16 shard, 2 B / 4 ranks; Megatron-FSDP's uint8 buffer holds 1 B / 4
    assert megatron_fsdp.fp8_shard_saving_bytes(12 * M, setup) == 12 * M * (2 - 1) / 4
    assert megatron_fsdp.fp8_shard_saving_bytes(12 * M, _setup(zero=1)) == 0.0


def test_zero_2_keeps_fsdp2s_largest_layer_term_and_one_rank_runs_nothing():
    profile, setup = _profile("gb200"), _setup(zero=2)
    assert not megatron_fsdp.runs(setup)
    largest = 50 * M
    assert gathered.unsharded_bytes(profile, 0, setup) == int(dataparallel.unsharded_bytes(largest, setup))
    one = setup.model_copy(update={"data_parallel": setup.data_parallel.model_copy(update={"dp": 1, "zero": 3})})
    assert not megatron_fsdp.runs(one) and megatron_fsdp.buffer_bytes(profile, 0, one) == 0.0


BASE = """--num-layers: 8
--hidden-size: 256
--num-attention-heads: 8
--seq-length: 128
--vocab-size: 1024
--swiglu: true
--bf16: true
--use-megatron-fsdp: true"""


def _job(tmp_path, flags: str):
    path = tmp_path / "args.yaml"
    path.write_text("MODEL_ARGS:\n" + "".join(f"  {line}\n" for line in flags.strip().splitlines()))
    return megatron.read(path)


def _status(job, flag):
    return next((s.status, s.what) for s in job.settings if s.name == flag)


def test_the_reader_takes_the_double_buffer_and_the_unit_under_optim_grads_params_only(tmp_path):
    job = _job(tmp_path, BASE + "\n--fsdp-double-buffer: true\n--suggested-communication-unit-size: 2000000")
    assert job.modelled.ddp["fsdp_double_buffer"] and job.modelled.ddp["suggested_communication_unit_size"] == 2 * M
    assert _status(job, "--fsdp-double-buffer")[0] == "modelled"
    zero2 = _job(tmp_path, BASE + "\n--data-parallel-sharding-strategy: optim_grads\n--fsdp-double-buffer: true")
    assert zero2.zero == 2 and "fsdp_double_buffer" not in zero2.modelled.ddp
    assert _status(zero2, "--fsdp-double-buffer")[0] == "not modelled"
    assert "not read" in _status(zero2, "--data-parallel-sharding-strategy")[1]


def test_the_cli_refuses_megatron_fsdps_settings_off_zero_3_and_scores_them_on_it(tmp_path):
    import json

    from fixtures.cli import run_ok

    from planner import io

    base = uniform_blocks(4)  # its layers are no blocks: every layer a unit
    profile = base.model_copy(update={"device": base.device.model_copy(update={"type": "cuda"}),
                                      "assumptions": {**base.assumptions, "gpu": "h100"}})
    path = tmp_path / "cuda.json"
    io.save_profile(profile, path)
    common = ["evaluate", "--profile", path, "--layers-per-stage", str(len(profile.layers)), "--ckpt-per-stage", "0",
              "--dp", "4", "--microbatches", "1", "--mem", "80GB", "--precision", "bf16-mixed", "--runtime", "megatron"]
    refused = run(*common, "--zero", "1", "--fsdp-double-buffer")
    assert refused.exit_code != 0 and "Traceback" not in refused.output
    assert "--fsdp-double-buffer is Megatron-FSDP's setting under ZeRO 3" in refused.output
    refused = run(*common, "--zero", "2", "--suggested-communication-unit-size", "1000")
    assert "--suggested-communication-unit-size is Megatron-FSDP's setting under ZeRO 3" in refused.output
    peaks = [json.loads(run_ok(*common, "--zero", "3", *extra, "--json").stdout)["hand"]["stages"][0]["peak_bytes"]
             for extra in ((), ("--fsdp-double-buffer",))]
    plain = _setup().model_copy(update={"training": _setup().training.model_copy(update={"float8": False,
                                                                                       "fp8_all_gather": False})})
    double = plain.model_copy(update={"data_parallel": plain.data_parallel.model_copy(
        update={"fsdp_double_buffer": True})})
    assert peaks[1] != peaks[0] and peaks[1] - peaks[0] == (gathered.unsharded_bytes(profile, 0, double) - gathered.unsharded_bytes(profile, 0, plain))
