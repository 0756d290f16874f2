"""Megatron-LM flags the reader listed "unknown" until it read them from arguments.py at d98e8a64: retired flags
refused as Megatron-LM refuses them, the encoder forms and the legacy rotary flag read as what they stand for, and
the rest classified with what each is (planner/models/configs/megatron_legacy.py)."""

from __future__ import annotations

import pytest
from fixtures.cli import run

from planner.errors import UserError
from planner.models.configs import megatron
from planner.models.configs.megatron_legacy import settled_pairs

BASE = ["--num-layers: 4", "--hidden-size: 256", "--num-attention-heads: 8", "--seq-length: 128",
        "--max-position-embeddings: 128", "--vocab-size: 1024", "--swiglu: true", "--bf16: true"]


def _job(tmp_path, lines):
    path = tmp_path / "args.yaml"
    path.write_text("MODEL_ARGS:\n" + "".join(f"  {line}\n" for line in lines))
    return megatron.read(path)


def _status(job, flag):
    return [(s.status, s.what) for s in job.settings if s.name == flag]


@pytest.mark.parametrize("flag, value, instead", [("--batch-size", "8", "--micro-batch-size"),
                                                  ("--warmup", "100", "--lr-warmup-fraction"),
                                                  ("--model-parallel-size", "2", "--tensor-model-parallel-size"),
                                                  ("--checkpoint-activations", "true", "--recompute-activations")])
def test_a_retired_flag_is_refused_in_one_sentence_naming_its_replacement(tmp_path, flag, value, instead):
    path = tmp_path / "args.yaml"
    path.write_text("MODEL_ARGS:\n" + "".join(f"  {line}\n" for line in [*BASE, f"{flag}: {value}"]))
    result = run("evaluate", "--from-megatron", path, "--gpus", "8", "--gpu", "H100")
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert f"gives {flag}, which Megatron-LM no longer takes" in result.output and instead in result.output


def test_megatron_deepspeeds_checkpoint_activations_is_left_to_its_reader():
    """Megatron-DeepSpeed takes --checkpoint-activations (megatron_deepspeed.py reads it with --deepspeed; without
    it a Megatron-DeepSpeed script is scored for Megatron-LM's runtime, its own flags listed)."""
    for own in ("--deepspeed", "--zero-stage"):
        pairs = [(own, []), ("--checkpoint-activations", [])]
        assert settled_pairs(pairs, "ds.sh") == (pairs, [])
    with pytest.raises(UserError, match="--recompute-activations"):
        settled_pairs([("--checkpoint-activations", [])], "m.sh")


@pytest.mark.parametrize("alias, flag, value", [("--encoder-num-layers", "--num-layers", "4"),
                                                ("--encoder-seq-length", "--seq-length", "128")])
def test_an_encoder_form_is_read_as_the_flag_it_stands_for(tmp_path, alias, flag, value):
    plain = _job(tmp_path, BASE)
    aliased = _job(tmp_path, [line for line in BASE if not line.startswith(flag + ":")] + [f"{alias}: {value}"])
    assert (aliased.arch, aliased.seq_len) == (plain.arch, plain.seq_len)
    assert _status(aliased, alias) == [("modelled", f"read as {flag}, as Megatron-LM reads it where {flag} is not "
                                                    "given (validate_args 1304-1311, 1346-1351 at d98e8a64)")]
    with pytest.raises(UserError, match=f"gives both {alias} and {flag}, which Megatron-LM refuses"):
        _job(tmp_path, [*BASE, f"{alias}: {value}"])


def test_the_legacy_rotary_flag_makes_rotary_positions_whatever_the_type_says(tmp_path):
    """A GPT-style block (no --swiglu): without the rotary flag a learned table of 128 x 256 positions is a
    parameter; with it, none, as with --position-embedding-type rope (arguments.py 1625-1627)."""
    gpt = [line for line in BASE if line != "--swiglu: true"]
    learned = _job(tmp_path, [*gpt, "--position-embedding-type: learned_absolute"])
    rope = _job(tmp_path, [*gpt, "--position-embedding-type: rope"])
    legacy = _job(tmp_path, [*gpt, "--position-embedding-type: learned_absolute",
                             "--use-rotary-position-embeddings: true"])
    assert learned.arch != rope.arch and legacy.arch == rope.arch
    assert any("--position-embedding-type learned_absolute: read as rope" in note for note in legacy.notes)
    assert _status(legacy, "--use-rotary-position-embeddings")[0][0] == "modelled"
    assert _job(tmp_path, [*gpt, "--use-rotary-position-embeddings: true"]).arch == rope.arch


def test_each_flag_read_from_the_code_is_listed_with_what_it_is(tmp_path):
    job = _job(tmp_path, [*BASE, "--freeze-all-layers: true", "--dino-teacher-temp: 0.07", "--mask-prob: 0.15",
                          "--enable-chunked-prefill: true", "--kv-lora-rank: 512", "--no-persist-layer-norm: true"])
    assert _status(job, "--freeze-all-layers")[0][0] == "not modelled"
    assert "forward only" in _status(job, "--freeze-all-layers")[0][1]
    assert _status(job, "--dino-teacher-temp")[0] == ("no effect", "DINO's loss: read by no Megatron-LM code at "
                                                                   "d98e8a64 but arguments.py")
    assert _status(job, "--mask-prob")[0][0] == "no effect" and "pretrain_bert.py" in _status(job, "--mask-prob")[0][1]
    assert [s for s, _ in (_status(job, "--enable-chunked-prefill") + _status(job, "--kv-lora-rank"))] == \
        ["no effect", "no effect"]
    assert _status(job, "--no-persist-layer-norm")[0][0] == "not modelled"
    assert job.of("unknown") == []


@pytest.mark.parametrize("alias, flag, value, says", [
    ("--encoder-num-layers", "--num-layers", "four", "--encoder-num-layers 'four' is not a whole number"),
    ("--encoder-num-layers", "--num-layers", "4 5", "--encoder-num-layers takes one value and was given 2 (4 5)"),
    ("--encoder-seq-length", "--seq-length", "0", "--encoder-seq-length 0: give 1 or more")])
def test_an_encoder_forms_bad_value_is_named_as_given(tmp_path, alias, flag, value, says):
    """The error names the flag the file gives, not the one it is read as (the reader said "--num-layers 'four' is
    not a whole number" of a file that gives no --num-layers)."""
    path = tmp_path / "args.yaml"
    lines = [line for line in BASE if not line.startswith(flag + ":")] + [f"{alias}: {value}"]
    path.write_text("MODEL_ARGS:\n" + "".join(f"  {line}\n" for line in lines))
    result = run("evaluate", "--from-megatron", path, "--gpus", "8", "--gpu", "H100")
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert says in result.output and f"{flag} " not in result.output.replace(alias, "")


@pytest.mark.parametrize("optimizer, momentum, status", [("adam", "0.9", "no effect"), ("sgd", "0.9", "modelled"),
                                                         ("sgd", "0", "not modelled"), ("sgd", "0.0", "not modelled")])
def test_sgd_momentum_is_listed_as_what_it_does_under_the_optimizer_given(tmp_path, optimizer, momentum, status):
    """--sgd-momentum is read by SGD only, and at 0 FusedSGD keeps no buffer while ckplan charges one (over):
    the reader listed it "modelled" under Adam and at 0 alike."""
    job = _job(tmp_path, BASE + [f"--optimizer: {optimizer}", f"--sgd-momentum: {momentum}"])
    [(said, what)] = _status(job, "--sgd-momentum")
    assert said == status and job.optimizer == optimizer
    assert ("the run steps adam" in what) == (optimizer == "adam")


def test_a_flag_given_false_is_listed_off_not_as_what_it_turns_on(tmp_path):
    """`--use-rotary-position-embeddings: false` was listed "no effect" with "read as --position-embedding-type
    rope" for what it is, which says the opposite."""
    job = _job(tmp_path, BASE + ["--use-rotary-position-embeddings: false"])
    [(said, what)] = _status(job, "--use-rotary-position-embeddings")
    assert said == "no effect" and what.startswith("given false, so off")
