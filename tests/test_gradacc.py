"""Each runtime's per-microbatch gradient accumulation charged as its code runs it (docs/framework-facts.md
§369-§374): DeepSpeed ZeRO 3's hooks in place of the profile's `.grad` add (planner/cost/deepspeed_grads.py), and
Megatron-LM's DDP hook adding an embedding's bf16 gradient into the fp32 main_grad (jobsettings.embedding_hook_add_ms).

A toy analytic profile: three layers of 10M parameters each (the embedding's table tied to the head's), an elementwise
rate of 1 TB/s (1 MB = 0.001 ms) and an HBM bandwidth of 2 TB/s; 4 microbatches."""

import pytest

from planner.cost import costmodel, deepspeed_grads, jobsettings, layers, tiedadd
from planner.schema import (
    DeviceInfo,
    FileRef,
    LayerProfile,
    Profile,
    StagePlan,
    TiedSet,
    TrainSetup,
)

PARAMS = 10_000_000
MB = 1e6  # bytes: 0.001 ms at 1 TB/s
MICROBATCHES = 4
ADD_MS = 0.3  # the tied table's InputBuffer add, the profile's sum_ms
ACCUMULATE_MS = 6 * PARAMS / 1e12 * 1e3  # the profile's .grad add: 3 x 2 B a parameter at 1 TB/s, 0.06 ms


def _profile(source: str = "analytic") -> Profile:
    def layer(name: str, kind: str, accumulate_ms: float) -> LayerProfile:
        return LayerProfile(name=name, kind=kind, fwd_ms=1.0, bwd_ms=2.0, fwd_ms_min=1.0, fwd_ms_max=1.0,
                            bwd_ms_min=2.0, bwd_ms_max=2.0, act_bytes=1 << 20, input_bytes=1 << 10,
                            output_bytes=1 << 10, param_count=PARAMS, param_bytes=2 * PARAMS, transient_bytes=0,
                            wgrad_accumulate_ms=accumulate_ms, lookup_param_count=PARAMS if name == "embed" else 0)

    return Profile(name="toy", created_at="now", torch_version="x", device=DeviceInfo(type="cuda", name="a100"),
                   dtype="bfloat16", micro_batch_size=1, model=FileRef(file="m.py", sha256="0" * 64), source=source,
                   assumptions={"membound_tbps": {"eager": 1.0, "by_class": {"elementwise": 1.0}}, "gpu_hbm_tbps": 2.0},
                   layers=[layer("embed", "embedding", 0.0), layer("block", "decoder_block", ACCUMULATE_MS),
                           layer("head", "head", ACCUMULATE_MS)],
                   tied=[TiedSet(layers=["embed", "head"], param_count=PARAMS, param_bytes=2 * PARAMS, sum_ms=ADD_MS)])


def _setup(runtime: str, *, zero: int = 0, dp: int = 1, stages: int = 1, microbatches: int = MICROBATCHES,
           **knobs) -> TrainSetup:
    return TrainSetup(stages=stages, microbatches=microbatches, micro_batch_size=1, schedule="1F1B",
                      mem_caps_bytes=[80 << 30] * stages, runtime=runtime, precision="bf16-mixed", optimizer="adam",
                      dp=dp, zero=zero, **knobs)


def _by_layer(term, setup: TrainSetup, profile: Profile | None = None) -> dict[str, float]:
    profile = profile or _profile()
    return {cost.name: term(cost, profile, setup) for cost in layers.layer_costs(profile)}


def test_zero3_hooks_copy_partition_and_check_in_place_of_the_grad_add():
    # ZeRO 3 over 4 ranks, DeepSpeed's 5e8-element bucket: each 10M-element gradient copied into it (4 B: 40 MB); its
    # 1/4 partition (2.5M) copied at the first microbatch (2 x 2 B), added at the three after (3 x 2 B), checked for
    # inf and NaN (8 B): 2.5M x (2 x (2 + 3 x 3) / 4 + 8) = 33.75 MB; less the profile's 60 MB add
    own = (40 * MB + 33.75 * MB - 60 * MB) / 1e9
    # the head's weight is the embedding's: no copy, no partition of its own, only its 60 MB add taken off
    assert _by_layer(deepspeed_grads.hooks_ms, _setup("deepspeed", zero=3, dp=4)) == pytest.approx(
        {"embed": own, "block": own, "head": -60 * MB / 1e9})


def test_a_gradient_over_the_bucket_is_not_copied_and_one_microbatch_only_copies_its_partition():
    setup = _setup("deepspeed", zero=3, dp=4, microbatches=1, reduce_bucket_size=5_000_000)
    # 2.5M x (2 x 2 + 8) = 30 MB against the 60 MB add
    assert _by_layer(deepspeed_grads.hooks_ms, setup)["block"] == pytest.approx(-30 * MB / 1e9)


def test_nothing_where_the_hooks_do_not_run_or_the_profile_timed_no_add():
    for setup, profile in ((_setup("deepspeed", zero=2, dp=4), _profile()), (_setup("deepspeed", zero=3), _profile()),
                           (_setup("deepspeed", zero=3, dp=4), _untimed(_profile())),
                           (_setup("deepspeed", zero=3, dp=4), _profile("measured").model_copy(update={"assumptions": {}})),
                           (_setup("torchtitan", zero=3, dp=4), _profile())):
        assert set(_by_layer(deepspeed_grads.hooks_ms, setup, profile).values()) == {0.0}


def test_a_fake_or_measured_profile_timed_the_add_as_the_megatron_hook_reads_it():
    # fake.py and measure.py make every `.grad` before the backward they time: the add ran there, so ZeRO 3's hooks
    # take it off as from the analytic profile, and the one predicate answers both terms alike
    for source in ("fake", "measured"):  # neither carries wgrad_accumulate_ms: its add is inside its backward
        profile = _profile(source).model_copy(update={"layers": [layer.model_copy(update={"wgrad_accumulate_ms": 0.0})
                                                                 for layer in _profile().layers]})
        assert jobsettings.accumulation_timed(profile)
        assert _by_layer(deepspeed_grads.hooks_ms, _setup("deepspeed", zero=3, dp=4), profile) == \
            pytest.approx(_by_layer(deepspeed_grads.hooks_ms, _setup("deepspeed", zero=3, dp=4)))
    assert not jobsettings.accumulation_timed(_untimed(_profile()))


def test_the_tied_add_is_charged_once_the_heads_accumulation_is_taken_off():
    adds = _by_layer(tiedadd.tied_local_add_ms, _setup("deepspeed", zero=3, dp=4))
    assert adds == {"embed": 0.0, "block": 0.0, "head": pytest.approx(MICROBATCHES * ADD_MS)}


def test_evaluate_moves_by_the_hooks_and_the_tied_add(monkeypatch):
    plan, setup = [StagePlan(index=0, layers=["embed", "block", "head"])], _setup("deepspeed", zero=3, dp=4)
    charged = costmodel.evaluate(plan, _profile(), setup).iteration_ms
    monkeypatch.setattr(deepspeed_grads, "takes_accumulation_off", lambda profile, setup: False)
    before = costmodel.evaluate(plan, _profile(), setup).iteration_ms
    hooks = 2 * (40 + 33.75 - 60) * MB / 1e9 - 60 * MB / 1e9
    assert charged - before == pytest.approx(MICROBATCHES * (hooks + ADD_MS))


def test_megatrons_hook_adds_an_embeddings_gradient_into_main_grad_with_or_without_the_fusion():
    # read 2 + 4, write 4 = 10 B against the profile's 6: 4 B x 10M at the elementwise rate, every microbatch
    for knobs in ({}, {"unfused_grad_accumulation": True}):
        adds = _by_layer(jobsettings.embedding_hook_add_ms, _setup("megatron", **knobs))
        assert adds == {"embed": pytest.approx(40 * MB / 1e9), "block": 0.0, "head": 0.0}
    # under --grad-reduce-in-bf16 main_grad is bf16: read 2 + 2, write 2, the profile's own 6 B
    assert set(_by_layer(jobsettings.embedding_hook_add_ms, _setup("megatron", grad_reduce_bf16=True)).values()) == {0.0}
    for runtime in ("torchtitan", "ckplan", "deepspeed"):  # torch's .grad add is the profile's own 6 B
        assert set(_by_layer(jobsettings.embedding_hook_add_ms, _setup(runtime)).values()) == {0.0}


def test_unfused_a_tied_heads_weight_on_one_stage_is_added_once_by_the_embeddings_hook():
    # one stage: the head's bf16 gradient meets the embedding's in autograd's add, then one hook add (the embedding's);
    # two stages: the head's copy is its own parameter, its hook adds it (4 B x 10M at the elementwise 1 TB/s, the
    # rate the profile timed its .grad add at, not the HBM's 2 TB/s)
    one = _by_layer(jobsettings.unfused_accumulation_ms, _setup("megatron", unfused_grad_accumulation=True))
    assert one == {"embed": 0.0, "block": pytest.approx(40 * MB / 1e9), "head": 0.0}
    two = _by_layer(jobsettings.unfused_accumulation_ms, _setup("megatron", zero=1, stages=2,
                                                                unfused_grad_accumulation=True))
    assert two["head"] == pytest.approx(40 * MB / 1e9)


def _untimed(profile: Profile) -> Profile:
    """The toy profile as --mfu makes it: timed by FLOPs alone, no .grad add in any backward."""
    return profile.model_copy(update={"assumptions": {**profile.assumptions, "mfu": 0.4},
                                      "layers": [layer.model_copy(update={"wgrad_accumulate_ms": 0.0})
                                                 for layer in profile.layers]})


def test_the_hook_add_is_charged_whole_where_the_profile_timed_no_grad_add():
    # --mfu: the profile's backward has no 6 B .grad add, so the hook's 10 B (read 2 + 4, write 4) are all beyond it
    untimed = _by_layer(jobsettings.embedding_hook_add_ms, _setup("megatron"), _untimed(_profile()))
    assert untimed == {"embed": pytest.approx(100 * MB / 1e9), "block": 0.0, "head": 0.0}
    # --grad-reduce-in-bf16 under --mfu: main_grad bf16, read 2 + 2, write 2 = 6 B, none of them timed
    bf16 = _by_layer(jobsettings.embedding_hook_add_ms, _setup("megatron", grad_reduce_bf16=True), _untimed(_profile()))
    assert bf16["embed"] == pytest.approx(60 * MB / 1e9)
    # a fake profile's backward runs into a .grad made before it (fake.py): timed, 4 B beyond
    fake = _by_layer(jobsettings.embedding_hook_add_ms, _setup("megatron"), _profile("fake"))
    assert fake["embed"] == pytest.approx(40 * MB / 1e9)
    # the unfused linears likewise: 10 B a weight under --mfu, at the elementwise rate
    unfused = _by_layer(jobsettings.unfused_accumulation_ms, _setup("megatron", unfused_grad_accumulation=True),
                        _untimed(_profile()))
    assert unfused == {"embed": 0.0, "block": pytest.approx(100 * MB / 1e9), "head": 0.0}


def test_megatron_fsdp_copies_the_gradient_into_its_bucket():
    # Megatron-FSDP's sharded gradient buffer: main_grad.copy_(grad), read 2, write 4 (fp32) = 6 B, the profile's own
    # 6 B: nothing beyond; under --grad-reduce-in-bf16 read 2, write 2 = 4 B, 2 B under the profile's add
    fsdp = _setup("megatron", zero=3, dp=4)
    assert _by_layer(jobsettings.embedding_hook_add_ms, fsdp)["embed"] == 0.0
    bf16 = _by_layer(jobsettings.embedding_hook_add_ms, _setup("megatron", zero=3, dp=4, grad_reduce_bf16=True))
    assert bf16["embed"] == pytest.approx(-20 * MB / 1e9)
    unfused = _by_layer(jobsettings.unfused_accumulation_ms, _setup("megatron", zero=3, dp=4, grad_reduce_bf16=True,
                                                                     unfused_grad_accumulation=True))
    assert unfused["block"] == pytest.approx(-20 * MB / 1e9)
    # the DDP add's 4 B at its own dtypes on a timed profile


def test_the_record_says_whether_the_hook_runs_and_the_setup_says_its_bytes():
    """The record's field was `unfused_wgrad_bytes: int = 4` and read only as on/off: the bytes beyond the profile
    are the setup's (4 DDP fp32, 0 under bf16 main_grad, 0 Megatron-FSDP fp32, 6 + 4 on an untimed profile), never
    the record's one figure; the field says what it is."""
    from planner.cost import runtimes

    record = runtimes.of(_setup("megatron").training)
    assert record.main_grad_hook is True and not hasattr(record, "unfused_wgrad_bytes")
    assert runtimes.of(_setup("torchtitan").training).main_grad_hook is False
    beyond = {knobs: jobsettings.beyond_profile_bytes(_profile(), _setup("megatron", **dict(knobs))) for knobs in (
        (), (("grad_reduce_bf16", True),), (("zero", 3), ("dp", 4)))}
    assert list(beyond.values()) == [4, 0, 0]
    assert jobsettings.beyond_profile_bytes(_untimed(_profile()), _setup("megatron")) == 10


def test_the_table_is_found_by_the_profiles_flag_not_by_its_kinds_name():
    # a user's model may call its lookup anything: the profile's lookup_param_count says which layer holds a table
    renamed = _profile().model_copy(update={"layers": [
        layer.model_copy(update={"kind": "TokenMixer" if layer.name == "embed" else layer.kind})
        for layer in _profile().layers]})
    assert _by_layer(jobsettings.embedding_hook_add_ms, _setup("megatron"), renamed)["embed"] == pytest.approx(
        40 * MB / 1e9)
    # a layer whose kind says "embedding" but which holds no table (a learned projection) is a linear's
    misnamed = _profile().model_copy(update={"layers": [
        layer.model_copy(update={"kind": "patch_embedding" if layer.name == "block" else layer.kind})
        for layer in _profile().layers]})
    assert _by_layer(jobsettings.embedding_hook_add_ms, _setup("megatron"), misnamed)["block"] == 0.0


def test_a_measured_layers_tables_are_its_lookups_parameters():
    from torch import nn

    from planner.profiler.kinds import lookup_param_count
    # nn.Embedding's 10 x 4 and nn.EmbeddingBag's 6 x 4; the linear's 4 x 4 + 4 are a GEMM's
    assert lookup_param_count(nn.Sequential(nn.Embedding(10, 4), nn.EmbeddingBag(6, 4), nn.Linear(4, 4))) == 64
    frozen = nn.Embedding(10, 4)
    frozen.weight.requires_grad_(False)
    assert lookup_param_count(nn.Sequential(frozen, nn.Linear(4, 4))) == 0


def test_zero3_offload_takes_each_partitions_fp64_norm_once_a_step(monkeypatch):
    # v0.6.2 at the boundary under offload_optimizer: the 2.5M-element partition (10M / 4) cast to fp64 (read 2, write
    # 8) and its norm read (8): 45 MB, once a step whatever the microbatches; the head's table is the embedding's
    setup = _setup("deepspeed", zero=3, dp=4, offload=True)
    assert _by_layer(deepspeed_grads.offload_norm_ms, setup) == pytest.approx(
        {"embed": 45 * MB / 1e9, "block": 45 * MB / 1e9, "head": 0.0})
    # the optimizer on the GPU, ZeRO 2, or another runtime: no such norm
    for other in (_setup("deepspeed", zero=3, dp=4), _setup("deepspeed", zero=2, dp=4, offload=True),
                  _setup("torchtitan", zero=3, dp=4, offload=True)):
        assert set(_by_layer(deepspeed_grads.offload_norm_ms, other).values()) == {0.0}
    # evaluate: the iteration grows by the two layers' norms once, not by the microbatches
    plan = [StagePlan(index=0, layers=["embed", "block", "head"])]
    with_norm = costmodel.evaluate(plan, _profile(), setup).iteration_ms
    monkeypatch.setattr(deepspeed_grads, "offload_norm_ms", lambda layer, profile, setup: 0.0)
    without = costmodel.evaluate(plan, _profile(), setup).iteration_ms
    assert with_norm - without == pytest.approx(2 * 45 * MB / 1e9)
