"""`ckplan search` held against the jobs people published at their scale (docs/published-runs.md
§42.searchscale): a framework's file compared beside the search is scored as `evaluate --from-*`
scores the same file, to the millisecond and the byte."""

from __future__ import annotations

import json

import pytest
from fixtures.cli import run_ok
from test_launchers import _tiny_config
from test_searchcheck import MEGATRON_ARGS

SHAPE = ("--gpus", "8", "--global-batch", "8", "--seq-len", "512")


def _compared_and_evaluated(tmp_path, args: str) -> tuple[dict, dict]:
    """The file's row in `search --from-megatron` and `evaluate --from-megatron` of the same file."""
    path = tmp_path / "megatron.yaml"
    path.write_text(args)
    searched = run_ok("search", "--arch-config", _tiny_config(tmp_path), *SHAPE, "--runtime", "megatron", "--top",
                      "1", "--json", "--out", tmp_path / "p.yaml", "--from-megatron", path)
    evaluated = run_ok("evaluate", "--from-megatron", path, "--gpus", "8", "--json")
    return json.loads(searched.stdout)["compared"][0], json.loads(evaluated.stdout)


def _device_bytes(evaluated: dict) -> int:
    """What search's table calls a rank's device bytes: its reserved peak and its workspaces (NCCL's buffers)."""
    return max(rank["reserved_bytes"] + rank["workspace_bytes"] for rank in evaluated["ranks"])


def test_a_file_with_context_parallelism_is_compared_at_its_cp(tmp_path):
    """--context-parallel-size 2 on 8 GPUs: dp 4 x cp 2, each rank half of each sequence. main scored it at
    CP 1 (dp 4 x 1: 4 of its 8 GPUs) and said so; the comparison now holds the file's CP."""
    args = MEGATRON_ARGS.replace("--tensor-model-parallel-size: 1", "--tensor-model-parallel-size: 1\n"
                                 "  --context-parallel-size: 2") + "  --overlap-grad-reduce: true\n"
    compared, evaluated = _compared_and_evaluated(tmp_path, args)
    assert (compared["degrees"]["cp"], compared["degrees"]["dp"]) == (evaluated["cp"], evaluated["dp"]) == (2, 4)
    assert compared["iteration_ms"] == pytest.approx(evaluated["iteration_ms"], rel=1e-12)
    assert compared["device_bytes_max"] == _device_bytes(evaluated)
    assert "context parallelism" not in (compared["note"] or "")


@pytest.mark.parametrize("overlap", [False, True])
def test_a_file_is_compared_with_its_own_ddp_settings(tmp_path, overlap):
    """Megatron-LM's DDP as the file sets it: without --overlap-grad-reduce the reductions run after the
    last backward, exposed (Megatron-LM's default, evaluate's). main scored the file with the runtime
    record's default, overlapped, whatever the file said: 5.925 ms against evaluate's 6.168 ms."""
    args = MEGATRON_ARGS + ("  --overlap-grad-reduce: true\n" if overlap else "")
    compared, evaluated = _compared_and_evaluated(tmp_path, args)
    assert compared["iteration_ms"] == pytest.approx(evaluated["iteration_ms"], rel=1e-12)
    assert compared["device_bytes_max"] == _device_bytes(evaluated)


def test_a_file_is_compared_with_its_own_userbuffers_config(tmp_path):
    """--tp-comm-overlap-cfg names one of Megatron-Bridge's userbuffers configs (its SMs and its GEMMs'
    methods, planner/cost/ub_sms.py): the compared file runs it, as evaluate does (main gave every
    configuration, the file's too, TE's defaults)."""
    args = MEGATRON_ARGS.replace("--tensor-model-parallel-size: 1", "--tensor-model-parallel-size: 4\n"
                                 "  --sequence-parallel: true\n  --tp-comm-overlap: true\n"
                                 "  --tp-comm-overlap-cfg: userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192")
    path = tmp_path / "megatron.yaml"
    path.write_text(args)
    searched = run_ok("search", "--arch-config", _tiny_config(tmp_path), *SHAPE, "--runtime", "megatron",
                      "--tp-overlap", "tp-comm-overlap", "--top", "1", "--json", "--out", tmp_path / "p.yaml",
                      "--from-megatron", path)
    evaluated = json.loads(run_ok("evaluate", "--from-megatron", path, "--gpus", "8", "--json").stdout)
    compared = json.loads(searched.stdout)["compared"][0]
    assert compared["degrees"]["tp"] == 4
    assert compared["iteration_ms"] == pytest.approx(evaluated["iteration_ms"], rel=1e-12)
    assert compared["device_bytes_max"] == _device_bytes(evaluated)


def test_a_file_whose_vocabulary_megatron_pads_is_compared_on_its_padded_model(tmp_path):
    """--vocab-size 8000 with Megatron-LM's default --make-vocab-size-divisible-by 128: the embedding and the
    output layer hold 8,064 rows, as Megatron-Bridge's 70B file's 128,256 become 128,512 at TP 4. main refused
    the file ("describes another model ... vocab_size 8064 against 8000") and searched nothing; the file is the
    searched model, compared on its padded rows as evaluate scores it."""
    args = MEGATRON_ARGS.replace("  --make-vocab-size-divisible-by: 8\n", "") + "  --overlap-grad-reduce: true\n"
    compared, evaluated = _compared_and_evaluated(tmp_path, args)
    assert compared["iteration_ms"] == pytest.approx(evaluated["iteration_ms"], rel=1e-12)
    assert compared["device_bytes_max"] == _device_bytes(evaluated)


def test_a_file_of_another_vocabulary_is_still_refused(tmp_path):
    """A --vocab-size that is not the searched model's is another model, padded or not: one sentence, exit 1."""
    from fixtures.cli import run

    path = tmp_path / "megatron.yaml"
    path.write_text(MEGATRON_ARGS.replace("--vocab-size: 8000", "--vocab-size: 7000"))
    result = run("search", "--arch-config", _tiny_config(tmp_path), *SHAPE, "--runtime", "megatron", "--top", "1",
                 "--out", tmp_path / "p.yaml", "--from-megatron", path)
    assert result.exit_code == 1
    assert "describes another model than the one searched (vocab_size 7000 against 8000)" in " ".join(
        result.output.split())


@pytest.mark.parametrize("flag, said", [
    ("--grad-reduce-in-bf16", "gradients reduced in bf16 (--grad-reduce-in-bf16) on (scored off, as the search)"),
    ("--timing-log-level", "the timers' level (--timing-log-level) 2 (scored 0, as the search)"),
])
def test_a_file_setting_the_search_scores_otherwise_is_said(tmp_path, flag, said):
    """A Megatron-LM flag the file sets and the search was not given is scored as the search scores every
    configuration, and said (main said nothing of these: Megatron-Bridge's Qwen3 30B file's
    --grad-reduce-in-bf16 beside a search without it was scored with fp32 gradients, unsaid)."""
    path = tmp_path / "megatron.yaml"
    path.write_text(MEGATRON_ARGS + f"  {flag}: {'2' if flag == '--timing-log-level' else 'true'}\n")
    searched = run_ok("search", "--arch-config", _tiny_config(tmp_path), *SHAPE, "--runtime", "megatron", "--top",
                      "1", "--json", "--out", tmp_path / "p.yaml", "--from-megatron", path)
    assert said in json.loads(searched.stdout)["compared"][0]["note"]


@pytest.mark.parametrize("training, tp_overlap, left", [
    ({}, "none", "torch.compile, Float8, AsyncTP"),
    ({"compile": True, "float8": True}, "none", "AsyncTP"),
    ({"compile": True, "float8": True}, "async-tp", ""),
])
def test_a_published_record_says_uncharged_only_what_the_search_leaves_uncharged(training, tp_overlap, left):
    """torchtitan's 405B 1F1B record ran torch.compile, Float8 and AsyncTP: a search given --compile --float8
    scores it compiled in Float8 (M15's record under the row's settings is evaluate's 19.6726 s to the digit),
    so its note must not say "not charged: torch.compile, Float8", as main's did whatever the search was given."""
    from planner.commands.search_compare import uncharged_said
    from planner.models.published import PUBLISHED
    from planner.solve.jobsearch import JobOptions

    record = next(p for p in PUBLISHED if p.name == "torchtitan 405B 1F1B")
    options = JobOptions(mem_cap_bytes=1, gpus_per_node=8, training=training, tp_overlap=tp_overlap)
    assert uncharged_said(record, options).not_expressible == left
    assert uncharged_said(record, options).name == record.name


def test_the_search_says_every_setting_it_scored_with(tmp_path):
    """Megatron-Bridge's settings given to the search are each said beside --float8 (main's line and JSON named
    --float8 and --fp8-all-gather alone, its DEFAULTS knowing no other, though every one was charged)."""
    result = run_ok("search", "--arch-config", _tiny_config(tmp_path), *SHAPE, "--runtime", "megatron", "--top", "1",
                    "--out", tmp_path / "p.yaml", "--grad-reduce-in-bf16", "--te-cross-entropy", "--nccl-nvls-off",
                    "--timing-log-level", "1")
    said = " ".join(result.output.split())
    assert ("every configuration scored with --timing-log-level 1 --grad-reduce-in-bf16 --te-cross-entropy "
            "--nccl-nvls-off") in said


@pytest.mark.parametrize("limit_s, most_s", [(100, 50.0), (1000, 60.0)])
def test_the_compared_configurations_are_scored_inside_the_limit(tmp_path, monkeypatch, limit_s, most_s):
    """§42.searchscale: scored after the search's deadline, a compared configuration's profile and 60 s plan solve
    ran past --time-limit (E2: 701 s for 600). They are scored first now, under the search's deadline: a plan
    solve 60 s at most and within half of what the limit has left (100 s: under 50 s), the search after them."""
    from planner.commands import search_compare
    from planner.solve import jobsearch

    events, real_score, real_search = [], search_compare.score, jobsearch.search_job

    def score(config, **kwargs):
        events.append(("score", kwargs["time_limit_s"]))
        return real_score(config, **kwargs)

    def search_job(*args, deadline, **kwargs):
        events.append(("search", deadline.elapsed_s()))
        return real_search(*args, deadline=deadline, **kwargs)

    monkeypatch.setattr(search_compare, "score", score)
    monkeypatch.setattr(jobsearch, "search_job", search_job)
    result = run_ok("search", "--arch-config", _tiny_config(tmp_path), *SHAPE, "--top", "1", "--json", "--out",
                    tmp_path / "p.yaml", "--tp", "1", "--micro-batch-size", "1", "--time-limit", str(limit_s))
    assert [what for what, _ in events] == ["score", "search"]
    assert 0 < events[0][1] <= most_s and (events[0][1] == 60.0) == (most_s == 60.0)
    assert json.loads(result.stdout)["compared"][0]["iteration_ms"] > 0
