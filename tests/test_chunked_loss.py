"""torchtitan's chunked cross-entropy (planner/cost/chunkedloss.py): its bytes by hand, against torch's
MemTracker on the installed torchtitan's ChunkedLossWrapper, in the cost model's terms, and from the CLI
and torchtitan's own configs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from planner.cost import costmodel, rules
from planner.cost.chunkedloss import chunked_head_profile, chunked_loss_bytes
from planner.cost.layers import layer_costs
from planner.errors import UserError
from planner.models import archs
from planner.models.configs import torchtitan
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup
from tests.fixtures.cli import run, run_ok
from tests.fixtures.scripts import load_script

ROOT = Path(__file__).parent.parent
RELEASE = Path(__file__).parent / "fixtures" / "configs" / "torchtitan_0_3_0" / "llama3" / "config_registry.py"
TINY = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=1024, tie_word_embeddings=False, max_position_embeddings=1024)
SHAPE = Shape(seq_len=128, micro_batch_size=2)


def test_the_loss_bytes_of_a_tiny_case_by_hand():
    # B 2, L 8, D 4, V 16, N 2: hidden bf16 T = 128 B, a chunk's bf16 logits g = 2 x 4 x 16 x 2 = 256 B;
    # held through the loop: the chunk copies (128) and the label chunks (2 x 8 x 8 = 128), the fp32 buffer (256)
    held = 128 + 128 + 256
    # the plain loss's peak on a chunk, 6g, with the loop's bf16 logits, and three fp32 scalars
    assert chunked_loss_bytes(batch=2, seq=8, hidden=4, vocab=16, chunks=2).peak_bytes == held + 7 * 256 + 12
    # FSDP2 with an fp32 reduce: the head's unsharded fp32 gradient (16 x 4 x 4 = 256) held too
    fsdp = chunked_loss_bytes(batch=2, seq=8, hidden=4, vocab=16, chunks=2, fsdp_fp32_grad=True)
    assert fsdp.peak_bytes == held + 256 + 7 * 256 + 12
    assert fsdp.kept_bytes == 4 and fsdp.largest_tensor_bytes == 512  # a chunk's fp32 logits
    # one sequence: each chunk is already contiguous, no copies. A wide head (D 512, V 8, L 8): the LM head's
    # backward sets the peak: the fp32 buffer (16384), the chunk's logits and their gradient (2 x 32), the
    # chunk's hidden gradient (2 x 512 x 2), the new weight gradient (8 x 512 x 2), three scalars
    assert chunked_loss_bytes(batch=1, seq=8, hidden=512, vocab=8, chunks=4).peak_bytes == \
        16384 + 2 * 32 + 2048 + 8192 + 12
    # many tokens, a narrow vocabulary (L 64, D 32, V 2): the end, the buffer (8192) beside its bf16 cast
    # (4096), the last chunk's logits (16 x 2 x 2) and two scalars
    assert chunked_loss_bytes(batch=1, seq=64, hidden=32, vocab=2, chunks=4).peak_bytes == 8192 + 4096 + 64 + 8


@pytest.mark.parametrize("case", [(2, 64, 32, 1024, 4), (1, 64, 32, 1024, 4), (2, 64, 512, 64, 4),
                                  (1, 16, 512, 64, 4), (3, 96, 256, 128, 3), (2, 64, 32, 1024, 1)])
def test_the_count_is_memtrackers_on_torchtitans_own_wrapper(case):
    """Each of the loop's moments: the inner loss's peak (6, 7), the head's backward (1, 16, 512, 64, 4),
    the buffer's cast at the end (2, 64, 512, 64, 4); with and without chunk copies; one chunk."""
    pytest.importorskip("torchtitan.components.loss")
    measure = load_script("bench_chunked_loss").measure

    batch, seq, hidden, vocab, chunks = case
    counted = chunked_loss_bytes(batch=batch, seq=seq, hidden=hidden, vocab=vocab, chunks=chunks)
    assert measure(*case) == {"peak": counted.peak_bytes, "kept": counted.kept_bytes}


def _profile():
    return analytic.analytic_profile(TINY, SHAPE, gpu=archs.gpu("h100"), model=FileRef(file="arch:t", sha256="0" * 64))


def _setup(chunks: int, runtime: str = "torchtitan", **more) -> TrainSetup:
    return TrainSetup.model_validate({"stages": 1, "microbatches": 1, "micro_batch_size": 2, "mem_caps_bytes": [1 << 40],
                                      "precision": "bf16-mixed", "runtime": runtime, "chunked_cross_entropy": chunks,
                                      **more})


def test_the_cost_models_loss_terms_are_the_chunked_ones():
    profile = _profile()
    logits = profile.layers[-1].output_bytes
    assert logits == 2 * 128 * 1024 * 2
    counted = chunked_loss_bytes(batch=2, seq=128, hidden=64, vocab=1024, chunks=4)
    setup = _setup(4)
    # no whole logits stay: the loss value alone (torchtitan without a pipeline drops the head's output: the
    # stage output charges nothing, rules.logits_in_loss_kept)
    assert rules.loss_kept_bytes(profile, 0, setup) == 4
    assert rules.last_layer_kept_bytes(layer_costs(profile)[-1], 0, profile, setup) == 0
    assert rules.stage_constant_transient_bytes(profile, 0, setup) == counted.peak_bytes - 4
    plain = _setup(0)
    assert rules.loss_kept_bytes(profile, 0, plain) == 2 * logits + 4  # torchtitan's plain loss: 2x kept, all its own
    # the time: the plain loss's, plus the copies and the fp32 buffer's bytes (2 x 128 x 64 elements x
    # (4 + 4 + 14 + 6) B) at the eager memory-bound rate
    moved = 2 * 128 * 64 * (2 * 2 + 4 + 14 + 6)
    rate = profile.assumptions["membound_tbps"]["eager"]
    assert rules.stage_constant_ms(profile, 0, setup) - rules.stage_constant_ms(profile, 0, plain) == \
        pytest.approx(moved / (rate * 1e12) * 1e3)


def test_the_heads_backward_is_the_norms_alone():
    profile = _profile()
    head = chunked_head_profile(profile, _setup(4)).layers[-1]
    assert head.transient_bytes == head.input_bytes == 2 * 128 * 64 * 2
    assert chunked_head_profile(profile, _setup(0)) is profile


def test_a_measured_profile_or_chunks_that_do_not_divide_the_sequence_are_refused():
    profile = _profile()
    with pytest.raises(UserError, match="3 does not divide 128: torchtitan refuses it"):
        chunked_head_profile(profile, _setup(3))
    measured = profile.model_copy(update={"source": "measured"})
    with pytest.raises(UserError, match="is scored on an analytic bf16 profile"):
        chunked_head_profile(measured, _setup(4))


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("c") / "tiny.json"
    path.write_text(_profile().model_dump_json())
    return path


def _peak(path, *extra) -> int:
    out = run_ok("evaluate", "--profile", path, "--layers-per-stage", "4", "--ckpt-per-stage", "0",
                 "--microbatches", "1", "--mem", "80GB", "--precision", "bf16-mixed", "--runtime", "torchtitan",
                 "--json", *extra).output
    return json.JSONDecoder().raw_decode(out[out.index("{"):])[0]["hand"]["stages"][0]["peak_bytes"]


def test_the_flag_takes_its_chunks_or_torchtitans_default(tiny_path):
    plain, default, eight, two = (_peak(tiny_path, *extra) for extra in
                                  ((), ("--chunked-cross-entropy",), ("--chunked-cross-entropy", "8"),
                                   ("--chunked-cross-entropy", "2")))
    assert default == eight < two < plain


def test_a_runtime_without_it_refuses_it_in_one_sentence(tiny_path):
    result = run("evaluate", "--profile", tiny_path, "--layers-per-stage", "4", "--ckpt-per-stage", "0", "--microbatches", "1",
                 "--mem", "80GB", "--runtime", "megatron", "--chunked-cross-entropy", "4")
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "chunked cross-entropy (--chunked-cross-entropy 4) is torchtitan 0.3.0's ChunkedLossWrapper" in result.output
    assert len(result.output.strip().splitlines()) <= 3


def test_torchtitans_configs_read_the_chunked_loss_and_its_chunks(tmp_path):
    job = torchtitan.read(Path(f"{RELEASE}:llama3_8b"))
    assert job.modelled.chunked_cross_entropy == 8  # ChunkedLossWrapper.Config's num_chunks default
    assert {s.name: s.status for s in job.settings}["loss.function"] == "modelled"
    source = RELEASE.read_text().replace("loss=ChunkedLossWrapper.Config(", "loss=ChunkedLossWrapper.Config(num_chunks=4, ")
    (tmp_path / "llama3").mkdir()
    (tmp_path / "llama3" / "config_registry.py").write_text(source)
    job = torchtitan.read(Path(f"{tmp_path / 'llama3' / 'config_registry.py'}:llama3_8b"))
    assert job.modelled.chunked_cross_entropy == 4
    assert {s.name: s.status for s in job.settings}["loss.num_chunks"] == "modelled"
    plain = torchtitan.from_mapping({"model": {"name": "llama3", "flavor": "8B"},
                                     "loss": {"function": "CrossEntropyLoss.Config(...)"}}, "t")
    assert plain.modelled.chunked_cross_entropy is None


def test_old_plans_read_false_as_no_chunks():
    assert dataclasses.asdict(archs.gpu("h100"))  # the GPU record unchanged
    setup = TrainSetup.model_validate({"stages": 1, "microbatches": 1, "micro_batch_size": 1, "mem_caps_bytes": [1],
                                       "chunked_cross_entropy": False})
    assert setup.training.chunked_cross_entropy == 0


def test_fsdp2s_head_backward_no_longer_holds_the_lm_heads_gradient():
    """ZeRO 3 over 8: at the head layer's backward the units still gather [norm, lm_head] for the norm's
    backward, but the LM head's gradient (1024 x 64) was reduced in the loss: neither its bf16 unsharded
    gradient (2 B) nor, in the post-backward, its fp32 reduce-scatter input (4 B) is there."""
    from planner.cost.layers import layer_costs

    profile = _profile()
    head = layer_costs(profile)[-1]
    plain = costmodel.unit_layer_bytes(head, 0, profile, _setup(0, dp=8, zero=3))
    chunked = costmodel.unit_layer_bytes(head, 0, profile, _setup(4, dp=8, zero=3))
    # the largest moment here is the start of the head's backward, before any of its gradients is made: the same
    assert plain > 0 and plain == chunked
    # (the end and the post-backward, where the plain head holds its LM head's gradient, take these off)
    from planner.cost.chunkedloss import head_grads_reduced_in_loss
    assert head_grads_reduced_in_loss(profile, _setup(4, dp=8, zero=3)) == (1024 * 64 * 2, 1024 * 64 * 6)


def test_beside_a_pipeline_the_stages_output_is_the_norms_and_stays():
    """torch's PipelineStage keeps the last stage's output in fwd_cache to its backward: under the chunked loss
    that output is the norm's [2, 128, 64] bf16, kept beside the bf16 gradient the loss saves; the peak is the
    loop's, so the scratch beyond what is kept is that much less."""
    profile = _profile()
    setup = _setup(4, stages=2, microbatches=2, mem_caps_bytes=[1 << 40] * 2)
    alone = _setup(4)
    hidden = 2 * 128 * 64 * 2
    # beside a pipeline the stage output keeps its 1x of the logits (torch's pipelining holds it), the loss the rest
    assert rules.loss_kept_bytes(profile, 1, setup) + profile.layers[-1].output_bytes \
        - rules.loss_kept_bytes(profile, 0, alone) == hidden
    assert rules.stage_constant_transient_bytes(profile, 0, alone) - \
        rules.stage_constant_transient_bytes(profile, 1, setup) == hidden
