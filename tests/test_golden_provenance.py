"""scripts/golden_runs.py --provenance's pieces (docs/published-runs.md §66.ghost): the Transformer Engine pin read
from a Megatron-LM pyproject.toml, the commit at which a golden file's steady step was logged, the H100 G rows it
reads; and scripts/bench_host_determinism.py's count of the `empty` ops deterministic mode fills."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch
from fixtures.scripts import load_script

from scripts import golden_runs

PYPROJECT = '''[tool.uv.sources]
flash_mla = [
    { git = "https://github.com/deepseek-ai/FlashMLA", rev = "9edee0c022cd0938148a18e334203b0aab43aa19" },
]
transformer-engine = { git = "https://github.com/NVIDIA/TransformerEngine.git", rev = "f031cf87bd054c7558b887df7bed93975456667f" }
'''


def test_te_pin_reads_the_transformer_engine_source_only():
    assert golden_runs.te_pin(PYPROJECT) == "f031cf87b"  # not FlashMLA's rev, listed first
    assert golden_runs.te_pin("[project]\nname = 'megatron-core'\n") is None
    assert golden_runs.te_pin(None) is None


def test_set_at_is_the_oldest_commit_of_the_newest_equal_run():
    # newest first: c4 rewrote the file keeping its value (NaNs dropped), c3 logged 0.19, c2 and c1 held 0.13
    history = [("c4", 0.1937), ("c3", 0.1937), ("c2", 0.1292), ("c1", 0.1236)]
    assert golden_runs.set_at(history) == ("c3", 0.1292)
    assert golden_runs.set_at([("c2", 0.05), ("c1", 0.05)]) == ("c1", None)  # never held another value
    assert golden_runs.set_at([("c1", 0.05)]) == ("c1", None)
    # a value that came back (0.09 -> 0.12 -> 0.09): the newest run's start, not the oldest equal value
    assert golden_runs.set_at([("c3", 0.09), ("c2", 0.12), ("c1", 0.09)]) == ("c3", 0.12)


def test_g_rows_are_the_g_rows_on_the_gpu_that_copy_a_test_and_say_if_deterministic():
    table = Path(golden_runs.__file__).with_name("published_rows.toml")
    rows = {row: (case, det) for row, case, det in golden_runs.g_rows(table)}
    assert rows["G44"] == ("gpt/gpt3_mcore_te_tp2_pp2_resume_torch_dist", True)
    assert rows["G48"] == ("gpt/gpt3_mcore_te_tp2_pp2_resume_torch_dist_cross_entropy_loss_fusion", False)
    assert "G50" not in rows  # G44's test on GB200
    assert not any(row.startswith(("T", "M")) for row in rows)
    gb200 = {row: case for row, case, _ in golden_runs.g_rows(table, "gb200")}
    assert gb200["G50"] == rows["G44"][0] and "G44" not in gb200


def test_empties_counts_each_empty_op_a_pass_dispatches():
    bench = load_script("bench_host_determinism")

    def fwd(x):
        a = torch.empty_like(x)  # 1
        b = x.new_empty(x.shape)  # 2
        return (x * 2 + a.zero_() + b.fill_(1.0)).sum()

    def one(x):
        return (x * torch.empty(3).fill_(2.0)).sum()  # 1; its mul's backward allocates through no empty

    make = lambda: torch.ones(3, requires_grad=True)  # noqa: E731
    assert bench.empties(fwd, make) == (2, 0)  # the two in the forward (new_empty's inner empty not redispatched)
    assert bench.empties(one, make) == (1, 0)


def test_the_loader_probe_makes_megatrons_gpt_sample():
    loader = load_script("bench_host_loader")
    sample = loader.GPTLikeDataset(4)[0]
    assert sorted(sample) == ["attention_mask", "labels", "loss_mask", "position_ids", "tokens"]
    assert sample["tokens"].shape == sample["labels"].shape == (4,) and sample["tokens"].dtype == torch.int64
    # gpt_dataset.py: tril(ones) < 0.5, True where a position may not attend (above the diagonal): 6 of 16
    assert sample["attention_mask"].shape == (1, 4, 4) and int(sample["attention_mask"].sum()) == 6
    assert bool(sample["attention_mask"][0, 0, 1]) and not bool(sample["attention_mask"][0, 1, 0])
    assert sample["position_ids"].tolist() == [0, 1, 2, 3] and sample["loss_mask"].dtype == torch.float32
    assert loader.OneInt()[7] == 7


def test_history_lists_every_logging_of_a_golden_file_newest_first(tmp_path):
    # a tiny repository: the golden file logged 0.2 s, rewritten keeping it (a NaN dropped), then 0.3 s
    def commit(values: dict, message: str) -> None:
        folder = tmp_path / "case"
        folder.mkdir(exist_ok=True)
        (folder / "golden_values_dev_dgx_h100.json").write_text(json.dumps({"iteration-time": {"values": values}}))
        subprocess.run(["git", "-C", str(tmp_path), "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm",
                        message, "--date", "2026-01-02T00:00:00"], check=True)

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    commit({"1": float("nan"), "4": 0.2, "5": 0.2, "6": 0.2}, "one")
    commit({"4": 0.2, "5": 0.2, "6": 0.2}, "two")
    commit({"2": 9.0, "4": 0.3, "5": 0.31, "6": 0.29}, "three")  # step 2 is warm-up: not in the median
    found = golden_runs.history(tmp_path, "HEAD", "case/golden_values_dev_dgx_h100.json")
    assert [step for _, _, step in found] == [0.3, 0.2, 0.2]
    assert all(len(rev) >= 7 for rev, _, _ in found)
    assert golden_runs.set_at([(rev, step) for rev, _, step in found]) == (found[0][0], 0.2)
