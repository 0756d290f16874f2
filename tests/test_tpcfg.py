"""Megatron-LM's --tp-comm-overlap-cfg file (planner/models/configs/ub_cfg.py, framework-facts §154): read with
yaml.safe_load, each GEMM's entry over TE v2.9's get_default_config (by the GEMM's default method), every key
checked, and the SMs each overlap takes charged as planner/cost/ub_sms.py charges them; counted by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from planner.commands.comm_setup import _userbuffers
from planner.cost import comm, ub_sms
from planner.errors import UserError
from planner.models.archs import gpu
from planner.models.configs import ub_cfg
from planner.models.configs.megatron import from_pairs
from planner.schema import TrainSetup

# by hand: proj_fprop a pipeline on 4 SMs without margin (4); fc2_fprop a ring exchange over the pipeline's defaults
# (num_sm 16, set_sm_margin true: 16); fc1_fprop a ring exchange's copies on 1 SM's CTAs (use_ce false: 1); qkv_fprop
# and proj_dgrad ring exchanges on the copy engines (0); fc2_dgrad a ring with a 3-SM margin (3); qkv_wgrad bulk 2;
# fc1_wgrad, qkv_dgrad, fc1_dgrad TE's bulk 16
CFG = """\
qkv_fprop: {method: ring_exchange, aggregate: 1}
proj_fprop: {method: pipeline, num_sm: 4, num_splits: 4, set_sm_margin: 0}
fc1_fprop: {use_ce: false}
fc2_fprop: {method: ring_exchange, aggregate: 0}
proj_dgrad: {num_sm: 8}
fc2_dgrad: {num_sm: 3, set_sm_margin: true}
qkv_wgrad: {method: bulk, num_sm: 2}
qkv_fprob: {num_sm: 2}
"""
TIMES = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]  # a block's eight collectives' ms, in site order


def _gemms(text: str = CFG, tp: int = 2):
    return ub_cfg.parse(ub_cfg.load(text, "ub.yaml"), "ub.yaml", tp=tp)


def _schema(gemms):
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[80 << 30], runtime="megatron",
                      comm=dict(tp=2, tp_gb_per_s=100.0, tp_overlap="tp-comm-overlap", gpu_sms=100,
                                ub_cfg="ub.yaml", ub_gemms=gemms)).comm.ub_gemms


def test_the_sms_each_gemm_takes_by_hand():
    gemms, _ = _gemms()
    table = ub_sms.overlaps("ub.yaml", _schema(gemms))
    assert {name: o.sms for name, o in table.items()} == {
        "qkv_fprop": 0, "fc1_fprop": 1, "proj_dgrad": 0, "fc2_dgrad": 3, "proj_fprop": 4, "fc2_fprop": 16,
        "qkv_dgrad": 16, "qkv_wgrad": 2, "fc1_dgrad": 16, "fc1_wgrad": 16}
    # forward: qkv 0 x 1 + proj 4 x 2 + fc1 1 x 3 + fc2 16 x 4 = 75 SM-ms of 100 SMs
    assert ub_sms.lost_sm_ms(TIMES, "fwd", config="ub.yaml", sms=100, gemms=_schema(gemms)) == pytest.approx(0.75)
    # backward: proj_dgrad 0 x 5 + qkv_wgrad 2 x 6 + fc2_dgrad 3 x 7 + fc1_wgrad 16 x 8 = 161, and the unlisted bulk
    # gathers qkv_dgrad 16 x 1 + fc1_dgrad 16 x 3 = 64: 225
    assert ub_sms.lost_sm_ms(TIMES, "bwd", config="ub.yaml", sms=100, gemms=_schema(gemms)) == pytest.approx(2.25)


def test_an_empty_file_is_tes_defaults_and_they_agree_with_the_cost_models():
    gemms, said = _gemms("")
    assert said == []
    table = ub_sms.overlaps("ub.yaml", _schema(gemms))
    assert table == ub_sms.TE_DEFAULT  # ub_cfg.te_default (models) and ub_sms.TE_DEFAULT (cost): one fact twice
    assert ub_sms.lost_sm_ms(TIMES, "fwd", config="ub.yaml", sms=100, gemms=_schema(gemms)) == \
        ub_sms.lost_sm_ms(TIMES, "fwd", config=None, sms=100)


def test_every_key_not_charged_is_listed():
    _, said = _gemms()
    rows = {name: (value, status) for name, value, status, _ in said}
    assert rows == {
        "--tp-comm-overlap-cfg qkv_fprob": ({"num_sm": 2}, "no effect"),  # a name TE never reads
        "--tp-comm-overlap-cfg proj_fprop.num_splits": (4, "no effect"),  # TE's default
        # qkv_fprop's aggregate is charged (planner/cost/ub_ring.py); TE never reads a reduce-scatter's
        "--tp-comm-overlap-cfg fc2_fprop.aggregate": (False, "no effect"),
    }


@pytest.mark.parametrize(("text", "sentence"), [
    ("qkv_fprop: {num_sms: 4}\n", "--tp-comm-overlap-cfg ub.yaml: qkv_fprop.num_sms is not a setting TE's add_ub "
     "takes (method, is_reduce_scatter, num_sm, cga_size, set_sm_margin, num_splits, aggregate, atomic_gemm, use_ce, "
     "fp8_buf, comm_priority, gemm_priority, pipeline_rs_overlap_first_gemm); TE v2.9 raises TypeError on it"),
    ("qkv_wgrad: {num_sm: four}\n", "--tp-comm-overlap-cfg ub.yaml: qkv_wgrad.num_sm is 'four', not a whole "
     "number; give a whole number"),
    ("qkv_wgrad: {set_sm_margin: 2}\n", "--tp-comm-overlap-cfg ub.yaml: qkv_wgrad.set_sm_margin is 2, not true or "
     "false; give true or false"),
    ("qkv_wgrad: {num_sm: 0}\n", "--tp-comm-overlap-cfg ub.yaml: qkv_wgrad.num_sm is 0; TE launches at least one "
     "SM's worth: give 1 or more"),
    ("qkv_wgrad: {num_sm: 100000}\n", "--tp-comm-overlap-cfg ub.yaml: qkv_wgrad.num_sm is 100000, and TE's bulk "
     "kernel counts its thread blocks' completion against NVTE_MAX_SMS = 32 (TE v2.9 userbuffers.h 31): give 32 or "
     "fewer"),
    ("fc2_fprop: {num_sm: 33}\n", "--tp-comm-overlap-cfg ub.yaml: fc2_fprop.num_sm is 33, and TE's pipeline kernel "
     "counts its thread blocks' completion against NVTE_MAX_SMS = 32 (TE v2.9 userbuffers.h 31): give 32 or fewer"),
    ("qkv_fprop: {method: pipeline}\n", "--tp-comm-overlap-cfg ub.yaml: qkv_fprop is an all-gather, and TE's add_ub "
     "raises ValueError on a pipeline there (base.py 380-383); give ring_exchange or bulk"),
    ("fc1_dgrad: {method: ring_exchange}\n", "--tp-comm-overlap-cfg ub.yaml: fc1_dgrad.method ring_exchange turns "
     "the bulk overlaps into the input gradient's reduce-scatter overlap (base.py 455-468, Megatron-LM's "
     "tp_comm_overlap_rs_dgrad), which ckplan does not charge; give bulk"),
    ("proj_wgrad: {method: bulk}\n", "--tp-comm-overlap-cfg ub.yaml: proj_wgrad.method bulk: external is the "
     "overlap of proj_wgrad and fc2_wgrad, and theirs only (base.py 302-312; 403-407 asserts it)"),
    ("qkv_fprop: ring_exchange\n", "--tp-comm-overlap-cfg ub.yaml: qkv_fprop is 'ring_exchange', not a mapping of "
     "settings (method: ..., num_sm: ...); TE updates the GEMM's defaults with a mapping"),
    ("- qkv_fprop\n", "--tp-comm-overlap-cfg ub.yaml is a list, not a mapping of TE's GEMM names (qkv_fprop, "
     "proj_fprop, ...) to their userbuffers settings; give one mapping"),
    ("qkv_fprop: [\n", "--tp-comm-overlap-cfg ub.yaml is not valid YAML at line 2; give a mapping of TE's GEMM "
     "names to their userbuffers settings"),
])
def test_a_bad_file_is_one_sentence(text, sentence):
    with pytest.raises(UserError) as caught:
        _gemms(text)
    assert str(caught.value) == sentence


def test_the_file_is_never_run():
    with pytest.raises(UserError, match="not valid YAML"):  # safe_load refuses a Python tag rather than run it
        _gemms("qkv_fprop: !!python/object/apply:os.system ['touch /tmp/tpcfg-ran']\n")


BASE = [("--num-layers", ["2"]), ("--hidden-size", ["256"]), ("--num-attention-heads", ["4"]),
        ("--seq-length", ["128"]), ("--max-position-embeddings", ["128"]), ("--vocab-size", ["1024"]),
        ("--tensor-model-parallel-size", ["2"]), ("--sequence-parallel", []), ("--tp-comm-overlap", [])]


def test_the_reader_finds_the_file_beside_the_config_or_in_the_script(tmp_path):
    (tmp_path / "ub.yaml").write_text(CFG)
    job = from_pairs([*BASE, ("--tp-comm-overlap-cfg", ["ub.yaml"])], str(tmp_path / "run.sh"))
    assert job.modelled.ub_cfg == "ub.yaml" and job.modelled.ub_gemms == _gemms()[0]
    said = {s.name: s.status for s in job.settings}
    assert said["--tp-comm-overlap-cfg"] == "modelled" and "--tp-comm-overlap-cfg qkv_fprop.aggregate" not in said
    assert job.modelled.ub_gemms["qkv_fprop"]["aggregate"]  # charged as TE's aggregated exchange (ub_ring.py)
    # written by the script as a here-document: read from it, not from the disk
    job = from_pairs([*BASE, ("--tp-comm-overlap-cfg", ["cfg/ub.yaml"])], str(tmp_path / "run.sh"),
                     {"cfg/ub.yaml": "qkv_wgrad: {num_sm: 5}\n"})
    assert job.modelled.ub_gemms["qkv_wgrad"] == {"method": "bulk", "num_sm": 5, "set_sm_margin": True,
                                                  "use_ce": True, "aggregate": False}
    h100 = gpu("h100-sxm")
    fields = _userbuffers(h100, SimpleNamespace(tp_overlap="tp-comm-overlap", ub_cfg="cfg/ub.yaml",
                                                ub_gemms=job.modelled.ub_gemms))
    assert fields == {"ub_cfg": "cfg/ub.yaml", "gpu_sms": 132, "ub_gemms": job.modelled.ub_gemms,
                      "ub_reduce_gb_per_s": pytest.approx(3.35 * 0.922 * 1e3),  # TE's ring-exchange reduce (§187)
                      "tp_copy_gb_per_s": 371.6}  # its peer copies at the copy engines' rate (ub_ring.py)


def test_a_missing_file_is_one_sentence_and_a_bare_name_is_bridges(tmp_path):
    with pytest.raises(UserError) as caught:
        from_pairs([*BASE, ("--tp-comm-overlap-cfg", ["ub.yaml"])], str(tmp_path / "run.sh"))
    assert str(caught.value) == (
        f"--tp-comm-overlap-cfg ub.yaml: no such file beside {tmp_path / 'run.sh'} or in the current directory "
        f"({tmp_path / 'ub.yaml'}, {tmp_path.cwd() / 'ub.yaml'}); give the YAML file Megatron-LM passes to TE's "
        "initialize_ub")
    job = from_pairs([*BASE, ("--tp-comm-overlap-cfg", ["userbuffers_x"])], str(tmp_path / "run.sh"))
    assert (job.modelled.ub_cfg, job.modelled.ub_gemms) == ("userbuffers_x", None)
    with pytest.raises(UserError, match="is neither a YAML file nor one of Megatron-Bridge 00b7660b's"):
        _userbuffers(gpu("h100-sxm"), SimpleNamespace(tp_overlap="tp-comm-overlap", ub_cfg="userbuffers_x"))


def test_a_hidden_pass_costs_the_files_sms(tmp_path):
    from planner.cost.layers import LayerCost
    from planner.schema import LayerCollective

    sites = [LayerCollective(kind=k, tensor_bytes=64 << 20, fwd=1, recompute=1) for k in ("all-gather",
                                                                                       "reduce-scatter") * 2]
    sites += [LayerCollective(kind=k, tensor_bytes=64 << 20, bwd=1) for k in ("all-gather", "reduce-scatter") * 2]
    layer = LayerCost(name="layers.0", kind="decoder_block", fwd_ms=100.0, bwd_ms=200.0, act_bytes=0, input_bytes=0,
                      output_bytes=0, input_in_act_bytes=0, param_count=1, transient_bytes=0,
                      collectives=[(c.kind, c.tensor_bytes, c.fwd, c.bwd, c.recompute, None) for c in sites])
    gemms, _ = _gemms()
    setup = TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[80 << 30], runtime="megatron",
                       comm=dict(tp=2, tp_gb_per_s=100.0, tp_overlap="tp-comm-overlap", gpu_sms=100,
                                 ub_cfg="ub.yaml", ub_gemms=gemms))
    one = comm.collective_ms("all-gather", 64 << 20, 2, comm.tp_link(setup.comm))
    assert one == comm.collective_ms("reduce-scatter", 64 << 20, 2, comm.tp_link(setup.comm))
    # each collective `one` ms: forward 0 + 4 + 1 + 16 = 21 SMs, backward 0 + 2 + 3 + 16 + 16 + 16 = 53
    assert comm.layer_comm_ms(layer, 0, setup) == pytest.approx(one * (21 + 53) / 100, rel=1e-12)


def test_without_the_overlap_the_file_is_never_opened(tmp_path):
    # Megatron-LM makes TE's communicators only under --tp-comm-overlap (initialize.py 164-166 at d98e8a64)
    job = from_pairs([*BASE[:-1], ("--tp-comm-overlap-cfg", ["missing.yaml"])], str(tmp_path / "run.sh"))
    assert (job.modelled.tp_overlap, job.modelled.ub_cfg, job.modelled.ub_gemms) == ("none", None, None)
    assert {s.name: s.status for s in job.settings}["--tp-comm-overlap-cfg"] == "no effect"


def test_num_sm_past_the_gpus_sms_is_what_te_does_with_it():
    # a bulk's kernel at NVTE_MAX_SMS is taken; a ring exchange's num_sm on the copy engines without a margin reaches
    # no kernel (one signalling block, userbuffers.cu 2314-2332): taken, charged nothing
    gemms, _ = _gemms("qkv_wgrad: {num_sm: 32}\nqkv_fprop: {num_sm: 60000}\n")
    assert (gemms["qkv_wgrad"]["num_sm"], gemms["qkv_fprop"]["num_sm"]) == (32, 60000)
    assert ub_sms.overlaps("ub.yaml", _schema(gemms))["qkv_fprop"].sms == 0
    # a ring's copies without the copy engines: a grid of 60000 blocks queues on the GPU's 100 SMs, so the GEMM
    # loses at most all of them while its exchange runs: 100 x 1 ms of qkv's, TE's pipelines 16 x 2 (proj), 16 x 4 (fc2)
    gemms, _ = _gemms("qkv_fprop: {num_sm: 60000, use_ce: false}\n")
    assert ub_sms.lost_sm_ms(TIMES, "fwd", config="ub.yaml", sms=100, gemms=_schema(gemms)) == pytest.approx(1.96)
    # with set_sm_margin TE leaves the GEMM the GPU's SMs less num_sm (comm_gemm_overlap.cpp 98-100): none on H100
    gemms, _ = _gemms("qkv_fprop: {num_sm: 132, set_sm_margin: true}\n")
    with pytest.raises(UserError) as caught:
        ub_sms.setup_fields(gpu("h100"), "tp-comm-overlap", config="ub.yaml", gemms=gemms)
    assert str(caught.value) == ("--tp-comm-overlap-cfg: qkv_fprop.num_sm is 132 with set_sm_margin, and TE runs the "
                                 "GEMM on the GPU's 132 SMs less num_sm (comm_gemm_overlap.cpp 98-100, TE v2.9), "
                                 "leaving it none: give fewer than 132 or set_sm_margin false")
    gemms, _ = _gemms("qkv_fprop: {num_sm: 131, set_sm_margin: true}\n")
    assert ub_sms.setup_fields(gpu("h100"), "tp-comm-overlap", config="ub.yaml", gemms=gemms)["gpu_sms"] == 132
    with pytest.raises(UserError, match=r"^--tp-comm-overlap-cfg ub.yaml: qkv_fprop.num_sm is 100000, past the 65536"):
        _gemms("qkv_fprop: {num_sm: 100000}\n")  # the schema's bound, said as the file's key, not a flag's
