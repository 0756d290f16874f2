"""GPT-OSS as Megatron-LM runs it (configs/megatron-bridge/*gptoss*.yaml, Megatron-Bridge 00b7660b): the
sliding-window flags read into each layer's window as is_layer_window_attention places them
(planner/models/configs/megatron_windows.py), their attention counted by hand, the refusals, and the
H100 row's micro-batch (the recipe's 1, framework-facts §100)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.errors import UserError
from planner.models.configs import megatron
from planner.models.gptoss import window_pairs
from planner.profiler import analytic_time, formulas

ROWS = Path(__file__).resolve().parent.parent / "configs" / "megatron-bridge"
TINY = [("--num-layers", ["6"]), ("--hidden-size", ["64"]), ("--num-attention-heads", ["4"]),
        ("--seq-length", ["512"]), ("--vocab-size", ["256"]), ("--swiglu", [])]


def _windows(*flags: tuple[str, list[str]]):
    return megatron.from_pairs(TINY + list(flags), "tiny.sh").arch.layer_windows


def test_the_bridge_gpt_oss_recipe_windows_the_odd_numbered_layers_at_129_keys():
    # GPTOSSProvider: window_size (128, 0), window_attn_skip_freq 2; layer_number 1, 3, ... windowed
    for name in ("b200_gptoss_120b_bf16", "gb200_gptoss_120b_bf16", "h100_gptoss_120b_bf16"):
        job = megatron.read(ROWS / f"{name}.yaml")
        assert job.arch.layer_windows == (129, None) * 18
        assert {"--window-size", "--window-attn-skip-freq"} <= {s.name for s in job.of("modelled")}


@pytest.mark.parametrize("flags, expected", [
    ([("--window-size", ["(8,0)"])], (9,) * 6),                                   # no frequency: every layer
    ([("--window-size", ["8,0"]), ("--window-attn-skip-freq", ["3"])], (9, 9, None, 9, 9, None)),
    ([("--window-size", ["[8,0]"]), ("--window-attn-skip-freq", ["[1,0,0]*2"])], (9, None, None) * 2),
    ([("--window-size", ["-1,0"])], ()),                                          # TE's -1: no window
    ([("--window-size", ["8,0"]), ("--window-attn-skip-freq", ["1"])], ()),      # every layer full
    ([("--window-attn-skip-freq", ["2"])], ()),                                   # no window without its size
    ([], ()),
])
def test_each_layer_windowed_as_megatron_places_it(flags, expected):
    assert _windows(*flags) == expected


@pytest.mark.parametrize("flags, said", [
    ([("--window-size", ["8,4"])], "attend 4 later tokens"),
    ([("--window-size", ["eight"])], "not two whole numbers"),
    ([("--window-size", ["8,0"]), ("--window-attn-skip-freq", ["[1,0]*2"])], "6 zeros and ones"),
])
def test_a_window_ckplan_cannot_read_is_refused_in_one_sentence(flags, said):
    with pytest.raises(UserError, match=said):
        _windows(*flags)


def test_the_refusal_reaches_the_user_without_a_traceback(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("torchrun pretrain_gpt.py " + " ".join(f"{flag} {' '.join(values)}" for flag, values in TINY)
                      + " --window-size 8,4 --micro-batch-size 1 --global-batch-size 8\n")
    result = CliRunner().invoke(cli, ["evaluate", "--from-megatron", str(script), "--gpus", "8", "--gpu", "h100"])
    assert result.exit_code != 0 and "attend 4 later tokens" in result.output
    assert "Traceback" not in result.output


def test_a_windowed_layer_runs_its_window_and_a_full_one_the_causal_triangle():
    arch = megatron.from_pairs(TINY + [("--window-size", ["8,0"]), ("--window-attn-skip-freq", ["2"])],
                               "tiny.sh").arch
    shape = formulas.Shape(seq_len=512, micro_batch_size=2)
    width = formulas.q_width(arch, shape)                     # 64: 4 heads of 16
    windowed, full = (analytic_time._attention(arch.layer(i), shape)[0][0] for i in (0, 1))
    # 9 keys a query: 9·10/2 + (512 - 9)·9 = 4,572 pairs a sequence, 4 FLOPs a pair per width, 2 sequences
    assert window_pairs(512, 9) == 4572
    assert windowed.flops * windowed.run_fraction == pytest.approx(4 * 2 * 4572 * width)
    assert (full.flops, full.run_fraction) == (4 * 1024 * 512 * width, 0.5)


def test_the_h100_row_runs_the_recipes_micro_batch():
    # BASE_GPT_OSS_120B_CONFIG's micro_batch_size=1, which the H100 preset keeps: 512 / (1 x DP 16) = 32
    job = megatron.read(ROWS / "h100_gptoss_120b_bf16.yaml")
    assert (job.micro_batch_size, job.global_batch_size, job.pp) == (1, 512, 4)
