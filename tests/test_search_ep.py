"""Expert parallelism where users meet it: `ckplan profile --ep E` makes a profile whose experts are timed as an
EP-E rank runs them (formulas.Shape.ep: experts / E grouped GEMMs of E x the tokens an expert holds); `ckplan
search` times every EP candidate from its own EP's profile; `ckplan solve --ep E` refuses an analytic profile made
at another EP in one sentence naming the `ckplan profile` line that makes the right one, and says what a measured
or --fake profile's experts' times assume (docs/published-runs.md §23.epprofile)."""

from __future__ import annotations

import json

import pytest
from fixtures.cli import run, run_ok

from planner import io
from planner.models import archs
from planner.profiler.analytic import Shape, analytic_profile
from planner.schema import FileRef
from planner.solve import bounds as bounds_mod
from planner.solve import jobsearch
from planner.solve.degrees import JobShape

GiB = 2**30
H100 = archs.gpu("h100")
# h 512, 8 heads, 4 K/V heads; every layer MoE: 8 experts of width 1024, top 2
TINY = archs.Arch(name="tiny-moe", hidden_size=512, intermediate_size=1024, num_layers=4, num_heads=8,
                  num_kv_heads=4, vocab_size=8000, tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                  moe_intermediate_size=1024)
REF = FileRef(file="arch:tiny-moe", sha256=TINY.sha256())
CONFIG = {"model_type": "mixtral", "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 4,
          "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 8000, "tie_word_embeddings": False,
          "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "num_local_experts": 8,
          "num_experts_per_tok": 2}


def _moe_times(profile) -> list[tuple[float, float]]:
    return [(layer.fwd_ms, layer.bwd_ms) for layer in profile.layers if layer.kind == "moe_block"]


def _spy():
    """profile_for that records the (tp, sp, mbs, ep) it is asked for, building the analytic profile at them."""
    asked = []

    def build(tp, sp, mbs, cp=1, ep=1):
        asked.append((tp, sp, mbs, ep))
        return analytic_profile(TINY, Shape(seq_len=1024, micro_batch_size=mbs, tp=tp, sp=sp, ep=ep), gpu=H100,
                                model=REF)

    return build, asked


def _job(**extra) -> JobShape:
    return JobShape(gpus=8, gpus_per_node=8, global_batch=8, seq_len=1024, num_layers=TINY.num_layers + 2,
                    tp_ok=(1,), num_experts=8, micro_batch_sizes=(1,), **extra)


def test_every_ep_candidate_is_timed_from_its_own_ep_profile():
    """8 GPUs, tp 1, mbs 1: ep 1, 2, 4, 8 over the dp ranks; each kept candidate's MoE blocks carry the times of
    the analytic profile at its ep, built once per ep, and an ep 8 rank's 1 GEMM of 8 x 256 rows beats 8 of 256."""
    build, asked = _spy()
    options = jobsearch.JobOptions(mem_cap_bytes=80 * GiB, gpus_per_node=8)
    outcome = jobsearch.Outcome()
    kept = jobsearch.candidates(_job(), options, jobsearch.Profiles(build), outcome)
    eps = {c.degrees.ep for c in kept}
    assert eps == {1, 2, 4, 8}
    for candidate in kept:
        assert candidate.profile.assumptions.get("ep", 1) == candidate.degrees.ep
    # one profile per (tp, sp, mbs, ep): pp 1, 2, 4 give dp 8, 4, 2, whose divisors are the eps asked
    assert sorted(set(asked)) == sorted(asked) == [(1, False, 1, ep) for ep in (1, 2, 4, 8)]
    by_ep = {ep: _moe_times(next(c.profile for c in kept if c.degrees.ep == ep)) for ep in (1, 8)}
    assert by_ep[8] == _moe_times(analytic_profile(TINY, Shape(seq_len=1024, micro_batch_size=1, ep=8), gpu=H100,
                                                   model=REF))
    assert by_ep[8][0][0] < by_ep[1][0][0]


def test_the_memory_bound_is_the_same_at_every_ep():
    """The search prunes on the ep 1 profile's memory bound and builds an EP profile only for what passes: that
    holds because an EP profile differs in times only (formulas.Shape.ep)."""
    build, _ = _spy()
    options = jobsearch.JobOptions(mem_cap_bytes=80 * GiB, gpus_per_node=8)
    for degrees in jobsearch.enumerate_degrees(_job()):
        if degrees.ep == 1:
            continue
        one, ep = build(1, False, 1), build(1, False, 1, ep=degrees.ep)
        setup = jobsearch.job_setup(one, degrees, options)
        a, b = bounds_mod.setup_bounds(one, setup), bounds_mod.setup_bounds(ep, setup)
        assert (a.memory_excess_bytes, a.static_bytes, a.limit_bytes) == \
            (b.memory_excess_bytes, b.static_bytes, b.limit_bytes)


def test_search_cli_writes_the_chosen_plan_with_its_ep_profile(tmp_path):
    """`ckplan search` on a tiny Mixtral-style config over 8 H100s chooses ep 8 (at dp 8), and the profile it
    writes beside the plan is timed as an ep 8 rank runs its experts: 8 / 8 = 1 local expert over
    8 x (1024 tokens x top 2 / 8 experts = 256) = 2,048 rows; its MoE blocks' times are the ep 8 analytic ones."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    result = run_ok("search", "--arch-config", config, "--gpus", "8", "--global-batch", "8", "--seq-len", "1024",
                    "--micro-batch-sizes", "1", "--top", "2", "--json", "--out", tmp_path / "plan.yaml")
    best = json.loads(result.stdout)["ranked"][0]["degrees"]
    assert best["ep"] == 8 and best["dp"] == 8
    written = io.load_profile(tmp_path / "plan.profile.json")
    assert written.assumptions["ep"] == 8
    assert "(1 local experts of 2048 tokens each)" in written.assumptions["moe_parallelism"]
    from planner.commands.profile_arch import _arch

    arch, ref = _arch(None, config)
    at = {ep: analytic_profile(arch, Shape(seq_len=1024, micro_batch_size=1, ep=ep), gpu=H100, model=ref)
          for ep in (1, 8)}
    assert _moe_times(written) == _moe_times(at[8]) != _moe_times(at[1])
    # the plan is solvable again from that profile at its ep, and refused at another
    run_ok("solve", "--profile", tmp_path / "plan.profile.json", "--stages", "1", "--dp", "8", "--ep", "8",
           "--precision", "bf16-mixed", "--out", tmp_path / "again.yaml")
    refused = run("solve", "--profile", tmp_path / "plan.profile.json", "--stages", "1", "--dp", "8", "--ep", "4",
                  "--precision", "bf16-mixed", "--out", tmp_path / "no.yaml")
    assert refused.exit_code != 0 and "as expert parallelism 8 runs them and --ep is 4" in refused.output
    assert "Traceback" not in refused.output


def test_profile_ep_times_the_ranks_grouped_gemm_and_refuses_what_it_cannot(tmp_path):
    result = run_ok("profile", "--arch", "mixtral-8x7b", "--seq-len", "4096", "--micro-batch-size", "1", "--ep", "8",
                    "--out", tmp_path / "p.json")
    assert "the experts timed as an --ep 8 rank runs them (1 GEMM of 8,192 rows)" in result.output
    assert io.load_profile(tmp_path / "p.json").assumptions["ep"] == 8
    for args, message in ((["--arch", "mixtral-8x7b", "--ep", "3"],
                           "--ep 3 does not divide mixtral-8x7b's 8 routed experts"),
                          (["--arch", "llama3-8b", "--ep", "2"], "llama3-8b has none: drop --ep")):
        refused = run("profile", *args, "--seq-len", "1024", "--out", tmp_path / "x.json")
        assert refused.exit_code != 0 and message in refused.output and "Traceback" not in refused.output
    measured = run("profile", "tests/fixtures/tiny.py", "--ep", "2", "--out", tmp_path / "m.json")
    assert measured.exit_code != 0 and "--ep applies to --arch/--arch-config profiles only" in measured.output


def test_solve_ep_on_an_ep_1_analytic_profile_names_the_profile_to_make(tmp_path):
    run_ok("profile", "--arch", "mixtral-8x7b", "--seq-len", "4096", "--micro-batch-size", "1", "--capacity-factor",
           "1.5", "--out", tmp_path / "p.json")
    refused = run("solve", "--profile", tmp_path / "p.json", "--stages", "4", "--dp", "8", "--ep", "8",
                  "--precision", "bf16-mixed", "--out", tmp_path / "plan.yaml")
    assert refused.exit_code != 0 and "Traceback" not in refused.output and not (tmp_path / "plan.yaml").exists()
    assert ("the profile times its experts' GEMMs as one device runs them all (expert parallelism 1) and --ep is 8; "
            "profile the model for it: ckplan profile --arch mixtral-8x7b --seq-len 4096 --micro-batch-size 1 "
            "--gpu h100-sxm --capacity-factor 1.5 --ep 8") in " ".join(refused.output.split())
    # a divisibility refusal comes first: re-profiling would not help it
    refused = run("solve", "--profile", tmp_path / "p.json", "--stages", "4", "--dp", "8", "--ep", "3",
                  "--precision", "bf16-mixed", "--out", tmp_path / "plan.yaml")
    assert "--ep 3 does not divide --dp 8" in refused.output


def test_solve_ep_on_a_measured_profile_says_what_its_times_assume(tmp_path):
    from planner.models.synthetic import layer, profile_of

    blocks = [layer(f"moe{i}", "MoE", fwd_ms=1.0, act_mib=1, input_mib=1, param_count=1000).model_copy(
        update={"routed_tokens": [8, 8, 8, 8], "expert_param_count": 800}) for i in range(2)]
    io.save_profile(profile_of(blocks).model_copy(update={"source": "measured"}), tmp_path / "moe.json")
    result = run_ok("solve", "--profile", tmp_path / "moe.json", "--stages", "2", "--mem", "1GiB", "--dp", "4",
                    "--ep", "2", "--out", tmp_path / "plan.yaml")
    assert ("--ep 2: the experts' times are this measured profile's, one device running its 4 routed experts each "
            "over its share of the tokens; an --ep 2 rank runs 1/2 of them over 2 x the tokens each") in \
        " ".join(result.output.split())


def test_search_on_a_given_analytic_profile_keeps_to_its_ep(tmp_path):
    """A given analytic profile's times hold at its own ep only: the search tries that one and says so."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    run_ok("profile", "--arch-config", config, "--seq-len", "1024", "--micro-batch-size", "1", "--ep", "4",
           "--out", tmp_path / "p.json")
    result = run_ok("search", "--profile", tmp_path / "p.json", "--gpus", "8", "--global-batch", "8", "--top", "3",
                    "--json", "--out", tmp_path / "plan.yaml")
    ranked = json.loads(result.stdout)["ranked"]
    assert ranked and {r["degrees"]["ep"] for r in ranked} == {4}
    assert "the search tries ep 4 only" in result.stderr


@pytest.mark.parametrize("ep, gpus, message", [(4, 8, None),
                                                (3, 6, "--ep 3 does not divide tiny-moe's 8 routed experts")])
def test_a_hand_configuration_is_timed_at_its_own_ep(ep, gpus, message):
    """A hand (or published) configuration beside the search: its profile at its own ep; an ep that divides its dp
    ranks but not the experts is its one-sentence reason, not a traceback."""
    from planner.commands.search import _Model
    from planner.commands.search_compare import hand_config, score

    model = _Model(arch=TINY, ref=REF)
    hand = hand_config(tp=1, sp=False, pp=1, dp=gpus, zero=1, shard_group=None, ep=ep, micro_batch_size=1,
                       schedule="1F1B", chunks=None, recompute="none", gpus=gpus, global_batch=gpus,
                       arch_name="tiny-moe", gpu="h100", seq_len=1024)
    options = jobsearch.JobOptions(mem_cap_bytes=80 * GiB, gpus_per_node=8, precision="bf16-mixed")
    scored = score(hand, gpus=gpus, global_batch=gpus, options=options, profile_for=model.profile_for(H100, 1024),
                   time_limit_s=60)
    if message is not None:
        assert scored.why_not.startswith(message)
        return
    assert not scored.why_not and scored.profile.assumptions["ep"] == 4


def test_search_on_a_measured_moe_profile_says_its_experts_times_are_one_devices(tmp_path):
    from planner.models.synthetic import layer, profile_of

    blocks = [layer(f"moe{i}", "MoE", fwd_ms=1.0, act_mib=1, input_mib=1, param_count=1000).model_copy(
        update={"routed_tokens": [8, 8, 8, 8], "expert_param_count": 800}) for i in range(2)]
    io.save_profile(profile_of(blocks).model_copy(update={"source": "measured"}), tmp_path / "moe.json")
    result = run_ok("search", "--profile", tmp_path / "moe.json", "--gpus", "4", "--global-batch", "8",
                    "--mem", "1GiB", "--json", "--out", tmp_path / "plan.yaml")
    assert {r["degrees"]["ep"] for r in json.loads(result.stdout)["ranked"]} >= {2}
    assert "the measured profile's experts' times are one device's" in " ".join(result.stderr.split())
