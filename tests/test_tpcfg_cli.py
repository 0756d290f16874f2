"""`ckplan evaluate --from-megatron` on a launch script or YAML whose --tp-comm-overlap-cfg names TE's userbuffers
config file (planner/models/configs/ub_cfg.py, framework-facts §154): a bad file is one sentence and a non-zero exit;
a good one is read, listed, and its SMs charged."""

from __future__ import annotations

import json
from pathlib import Path

from fixtures.cli import run, run_ok

MODEL = ("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
         "--vocab-size 1024 --micro-batch-size 1 --global-batch-size 8 --bf16 --tensor-model-parallel-size 2 "
         "--sequence-parallel --tp-comm-overlap")
# fewer SMs than TE's defaults on every overlap that takes some: bulk and pipeline 16 -> 2
FEWER = "proj_fprop: {num_sm: 2}\nfc2_fprop: {num_sm: 2}\nqkv_dgrad: {num_sm: 2}\nqkv_wgrad: {num_sm: 2}\n" \
        "fc1_dgrad: {num_sm: 2}\nfc1_wgrad: {num_sm: 2, cga_size: 4}\n"


def _script(folder: Path, cfg: str | None, text: str | None = None) -> Path:
    if text is not None:
        (folder / "ub.yaml").write_text(text)
    path = folder / "run.sh"
    path.write_text(f"torchrun --nproc-per-node 2 pretrain_gpt.py {MODEL}"
                    + (f" --tp-comm-overlap-cfg {cfg}" if cfg else "") + "\n")
    return path


def _fails(path: Path) -> str:
    result = run("evaluate", "--from-megatron", path, "--gpu", "h100")
    assert result.exit_code != 0 and result.output.strip().count("\n") == 0, result.output
    return result.output.strip()


def test_a_missing_file_a_bad_key_and_a_bad_type_are_one_sentence(tmp_path):
    path = _script(tmp_path, "ub.yaml")
    assert _fails(path) == (
        f"Error: --tp-comm-overlap-cfg ub.yaml: no such file beside {path} or in the current directory "
        f"({tmp_path / 'ub.yaml'}, {Path.cwd() / 'ub.yaml'}); give the YAML file Megatron-LM passes to TE's "
        "initialize_ub")
    _script(tmp_path, "ub.yaml", "fc1_wgrad: {num_sms: 2}\n")
    assert _fails(path) == (
        f"Error: --tp-comm-overlap-cfg {tmp_path / 'ub.yaml'}: fc1_wgrad.num_sms is not a setting TE's add_ub takes "
        "(method, is_reduce_scatter, num_sm, cga_size, set_sm_margin, num_splits, aggregate, atomic_gemm, use_ce, "
        "fp8_buf, comm_priority, gemm_priority, pipeline_rs_overlap_first_gemm); TE v2.9 raises TypeError on it")
    _script(tmp_path, "ub.yaml", "fc1_wgrad: {num_sm: 2.5}\n")
    assert _fails(path) == (f"Error: --tp-comm-overlap-cfg {tmp_path / 'ub.yaml'}: fc1_wgrad.num_sm is 2.5, not a "
                            "whole number; give a whole number")


def test_a_launch_script_naming_the_file_is_charged_its_sms(tmp_path):
    plain = json.loads(run_ok("evaluate", "--from-megatron", _script(tmp_path, None), "--gpu", "h100",
                              "--json").stdout)
    found = json.loads(run_ok("evaluate", "--from-megatron", _script(tmp_path, "ub.yaml", FEWER), "--gpu", "h100",
                              "--json").stdout)
    said = {s["name"]: (s["value"], s["status"]) for s in found["settings"]}
    assert said["--tp-comm-overlap-cfg"] == ("ub.yaml", "modelled")
    assert said["--tp-comm-overlap-cfg fc1_wgrad.cga_size"] == ("4", "not modelled")
    # the same plan, its GEMMs losing 2 SMs where TE's defaults take 16: faster
    assert found["ranks"][0]["peak_bytes"] == plain["ranks"][0]["peak_bytes"]
    assert found["iteration_ms"] < plain["iteration_ms"]


def test_megatron_lms_own_file_is_read():
    from planner.models.configs.megatron import read

    # its --tp-comm-overlap-cfg is a path from Megatron-LM's root, copied to the same path beside the config
    job = read(Path(__file__).resolve().parents[1] / "configs/megatron-lm/"
               "gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap.yaml")
    said = {s.name: (s.value, s.status) for s in job.settings}
    assert said["--tp-comm-overlap"][1] == "modelled" and said["--tp-comm-overlap-cfg"][1] == "modelled"
    assert "--tp-comm-overlap-cfg qkv_fprop.aggregate" not in said  # charged: TE's aggregated exchange (ub_ring.py)
    assert job.modelled.ub_gemms["qkv_fprop"]["aggregate"] and job.modelled.ub_gemms["proj_dgrad"]["aggregate"]
    assert said["--tp-comm-overlap-cfg proj_fprop.num_splits"] == ("4", "no effect")  # TE's default
    # fc2_fprop a ring exchange over the pipeline's defaults: 16 SMs kept off the GEMM (set_sm_margin)
    assert job.modelled.ub_gemms["fc2_fprop"] == {"method": "ring_exchange", "num_sm": 16, "set_sm_margin": True,
                                                  "use_ce": True, "aggregate": False}
    assert job.modelled.ub_gemms["proj_fprop"] == {"method": "pipeline", "num_sm": 4, "set_sm_margin": False,
                                                   "use_ce": True, "aggregate": False}
