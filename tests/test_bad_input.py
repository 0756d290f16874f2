"""Faults and bad input from issue 9, each ending in one sentence, exit 1, no traceback,
no file left behind: profiles checked at the schema, every output path checked before
any work, files written like `open()` would (umask, symlinks, special files), model
files that hang, exit, or whose layer chain is not their forward()."""

import json
import os
import pathlib
import stat

import pytest
import torch
from click.testing import CliRunner
from fixtures.rt_plans import make_plan
from torch import nn

from planner import io
from planner.cli import cli
from planner.errors import UserError
from planner.models import modelfile, synthetic

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
FAST = ["--repeats", "1", "--warmup", "0", "--threads", "1"]


def _invoke(*args):
    return CliRunner().invoke(cli, [str(arg) for arg in args])


def _refused(result, *needles: str) -> str:
    """One clean sentence: exit 1, no traceback, every needle in it."""
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = [line for line in result.output.strip().splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, result.output
    for needle in needles:
        assert needle in result.output, result.output
    return result.output


def _files(folder: pathlib.Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


@pytest.fixture()
def profile_path(tmp_path):
    layers = [synthetic.layer(f"blocks.{i}", "Block", fwd_ms=1, act_mib=1, input_mib=0.5, param_count=1000)
              for i in range(3)]
    path = tmp_path / "p.json"
    io.save_profile(synthetic.profile_of(layers), path)
    return path


@pytest.fixture()
def plan_path(tmp_path):
    path = tmp_path / "plan.yaml"
    io.save_plan(make_plan(FIXTURES / "tiny.py", [["0", "1"], ["2"]]), path)
    return path


@pytest.fixture()
def no_run(monkeypatch):
    """The pipeline must not start: the command is refused before any work."""

    def refuse(*args, **kwargs):
        raise AssertionError("the run started before the output paths were checked")

    monkeypatch.setattr("planner.runtime.launcher.run_plan", refuse)
    monkeypatch.setattr("planner.runtime.run_plan", refuse)


# ---------------------------------------------------------------- 5: profiles checked at the schema


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda p: p["layers"][1].update(fwd_ms=float("nan")), "layers.1.fwd_ms"),
        (lambda p: p["layers"][0].update(bwd_ms=float("inf")), "layers.0.bwd_ms"),
        (lambda p: p["layers"][2].update(act_bytes=-5), "layers.2.act_bytes"),
        (lambda p: p["layers"][0].update(param_count=10**30), "layers.0.param_count"),
        (lambda p: p["layers"][0].update(recompute_ms=-1.0), "layers.0.recompute_ms"),
        (lambda p: p["layers"][0].update(step_ms={"adam": float("nan")}), "layers.0.step_ms.adam"),
        (lambda p: p.update(loss_ms=float("-inf")), "loss_ms"),
        (lambda p: p.update(batch_input_bytes=2**70), "batch_input_bytes"),
        (lambda p: p.update(dtype="float8"), "dtype"),
    ],
)
def test_bad_numbers_in_a_profile_are_refused_naming_the_field(profile_path, tmp_path, edit, field):
    data = json.loads(profile_path.read_text())
    edit(data)
    profile_path.write_text(json.dumps(data))  # json writes NaN and Infinity as Python reads them
    out = tmp_path / "plan.yaml"
    result = _invoke("solve", "--profile", profile_path, "--mem", "1GB", "--stages", "2", "--out", out)
    _refused(result, f"field '{field}'", "not a valid profile")
    assert not out.exists()


# ---------------------------------------------------------------- 6, 12, 13: output paths, before any work


def test_compare_plot_at_a_folder_is_refused_before_running(plan_path, tmp_path, no_run):
    out = tmp_path / "c.json"
    out.write_text("earlier comparison")
    (tmp_path / "plots").mkdir()
    result = _invoke("compare", plan_path, "--out", out, "--plot", tmp_path / "plots")
    _refused(result, "is a folder; choose another --plot")
    assert out.read_text() == "earlier comparison"


def test_compare_out_and_plot_the_same_file_is_refused(plan_path, tmp_path, no_run):
    result = _invoke("compare", plan_path, "--out", tmp_path / "x", "--plot", tmp_path / "x")
    _refused(result, "--out and --plot are the same file")
    assert not (tmp_path / "x").exists()


def test_solve_out_equal_to_its_profile_is_refused(profile_path):
    before = profile_path.read_bytes()
    result = _invoke("solve", "--profile", profile_path, "--mem", "1GB", "--stages", "2", "--out", profile_path)
    _refused(result, "is the --profile this command reads", "choose another --out")
    assert profile_path.read_bytes() == before


def test_solve_out_through_a_symlink_to_its_profile_is_refused(profile_path, tmp_path):
    link = tmp_path / "link.yaml"
    link.symlink_to(profile_path)
    before = profile_path.read_bytes()
    result = _invoke("solve", "--profile", profile_path, "--mem", "1GB", "--stages", "2", "--out", link)
    _refused(result, "is the --profile this command reads")
    assert profile_path.read_bytes() == before


def test_sweep_plot_at_a_folder_is_refused_before_sweeping(profile_path, tmp_path, monkeypatch):
    monkeypatch.setattr("planner.commands.sweep.run_sweep", lambda *a, **k: pytest.fail("the sweep started"))
    result = _invoke("solve", "--profile", profile_path, "--mem", "1GB", "--stages", "2", "--sweep",
                     "--plot", tmp_path)
    _refused(result, "is a folder; choose another --plot")


def test_launch_report_equal_to_its_plan_is_refused(plan_path, no_run):
    before = plan_path.read_bytes()
    result = _invoke("launch", plan_path, "--report", plan_path)
    _refused(result, "is the PLAN this command reads", "choose another --report")
    assert plan_path.read_bytes() == before


def test_launch_report_at_a_folder_names_report_not_out(plan_path, tmp_path, no_run):
    result = _invoke("launch", plan_path, "--report", tmp_path)
    output = _refused(result, "is a folder; choose another --report")
    assert "--out" not in output


def test_profile_out_equal_to_the_model_file_is_refused(tmp_path):
    model = tmp_path / "m.py"
    model.write_text((FIXTURES / "tiny.py").read_text())
    result = _invoke("profile", model, *FAST, "--out", model)
    _refused(result, "is the MODEL.py this command reads")
    assert model.read_text() == (FIXTURES / "tiny.py").read_text()


def test_out_that_only_a_real_write_finds_unwritable_is_refused_before_profiling(tmp_path, monkeypatch):
    # os.access trusts permission bits (root passes them all); a read-only mount is found by writing
    monkeypatch.setattr("planner.profiler.measure.measure_model", lambda *a, **k: pytest.fail("profiled"))
    real_mkstemp = io.tempfile.mkstemp

    def read_only(*args, dir=None, **kwargs):
        if pathlib.Path(dir) == tmp_path:
            raise OSError(30, "Read-only file system")
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(io.tempfile, "mkstemp", read_only)
    result = _invoke("profile", FIXTURES / "tiny.py", *FAST, "--out", tmp_path / "p.json")
    _refused(result, "not writable (Read-only file system); choose another --out")


# ---------------------------------------------------------------- 9: written like open() would


def test_new_files_honour_the_umask_and_replaced_files_keep_their_mode(tmp_path):
    old = os.umask(0o022)
    try:
        io.write_atomic(tmp_path / "new.json", "x")
        assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o644
        os.umask(0o077)
        io.write_atomic(tmp_path / "private.json", "x")
        assert stat.S_IMODE((tmp_path / "private.json").stat().st_mode) == 0o600
        (tmp_path / "new.json").chmod(0o640)
        io.write_atomic(tmp_path / "new.json", "y")
        assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o640
    finally:
        os.umask(old)
    assert _files(tmp_path) == ["new.json", "private.json"]  # no temp file left


def test_a_symlink_is_followed_and_stays_a_link(tmp_path):
    target = tmp_path / "real" / "plan.yaml"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "plan.yaml"
    link.symlink_to(target)
    io.write_atomic(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
    assert _files(target.parent) == ["plan.yaml"]


def test_a_fifo_at_the_output_is_refused_and_left_alone(profile_path, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    result = _invoke("solve", "--profile", profile_path, "--mem", "1GB", "--stages", "2", "--out", fifo)
    _refused(result, "is a named pipe (FIFO), not a regular file; choose another --out")
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    with pytest.raises(UserError, match="named pipe"):
        io.write_atomic(fifo, "x")  # never blocks waiting for a reader


def test_a_character_device_is_written_in_place(tmp_path, monkeypatch):
    # never write the real /dev/null here: a broken write_atomic would replace it for the whole machine
    io.check_writable("/dev/null")
    device = tmp_path / "device"
    device.write_text("")
    inode = device.stat().st_ino
    monkeypatch.setattr(io, "_special_kind", lambda path: "character device" if path == device else None)
    io.write_atomic(device, "discarded")
    assert device.stat().st_ino == inode and device.read_text() == "discarded"
    assert _files(tmp_path) == ["device"]


# ---------------------------------------------------------------- 13: wording


def test_a_folder_given_as_input_is_called_a_folder(tmp_path):
    _refused(_invoke("solve", "--profile", tmp_path, "--mem", "1GB", "--stages", "1",
                     "--out", tmp_path / "plan.yaml"), "is a folder, not a file")
    _refused(_invoke("launch", tmp_path), "is a folder, not a file")
    _refused(_invoke("profile", tmp_path, "--out", tmp_path / "p.json"), "is a folder, not a file")


def test_a_nul_byte_in_a_model_file_says_no_line_none(tmp_path):
    model = tmp_path / "nul.py"
    model.write_bytes(b"import torch\x00\n")
    output = _refused(_invoke("profile", model, "--out", tmp_path / "p.json"), "not valid Python")
    assert "None" not in output


def test_a_memory_cap_below_one_byte_reads_without_pydantic(profile_path, tmp_path):
    output = _refused(_invoke("solve", "--profile", profile_path, "--mem", "0.1", "--stages", "1",
                              "--out", tmp_path / "plan.yaml"), "less than one byte", "0.1GB")
    assert "Value error" not in output


def test_setup_errors_carry_no_pydantic_prefix():
    from pydantic import ValidationError

    from planner.schema import TrainSetup

    with pytest.raises(ValidationError) as info:
        TrainSetup(stages=2, microbatches=2, micro_batch_size=1, mem_caps_bytes=[1, 0])
    assert io.describe_error(info.value) == "every memory cap must be greater than zero"


def _model_file(tmp_path, body: str, name: str = "m.py") -> pathlib.Path:
    path = tmp_path / name
    path.write_text("import sys\nimport torch\nfrom torch import nn\n" + body)
    return path


@pytest.mark.parametrize(
    "targets, needle",
    [
        ("torch.randn(n, 5)", "targets of shape (4, 5) but the last layer's output has shape (4, 4)"),
        ("torch.randn(n, 1)", "targets of shape (4, 1)"),  # MSE would broadcast it silently
        ("torch.randint(0, 4, (n, 3))", "cross-entropy"),
    ],
)
def test_wrong_targets_blame_the_default_loss_not_a_loss_fn(tmp_path, targets, needle):
    model = _model_file(tmp_path, "def build_model():\n    return nn.Sequential(nn.Linear(8, 4))\n"
                                  f"def example_batch(n):\n    return torch.randn(n, 8), {targets}\n")
    output = _refused(_invoke("profile", model, *FAST, "--out", tmp_path / "o" / "p.json"),
                      needle, "defines no loss_fn", "fix the targets or define loss_fn(output, target)")
    assert "loss_fn(output, target) failed" not in output
    assert not (tmp_path / "o").exists()


def test_a_users_loss_fn_that_fails_is_named_with_its_line(tmp_path):
    model = _model_file(tmp_path, "def build_model():\n    return nn.Sequential(nn.Linear(8, 4))\n"
                                  "def example_batch(n):\n    return torch.randn(n, 8), torch.randn(n, 5)\n"
                                  "def loss_fn(output, target):\n    return (output - target).sum()\n")
    _refused(_invoke("profile", model, *FAST, "--out", tmp_path / "p.json"),
             "loss_fn(output, target) failed on the last layer's output (shape (4, 4)) and example_batch()'s "
             "targets (shape (4, 5)): RuntimeError", "line 9: return (output - target).sum()")


def test_a_model_with_zero_layers_gets_a_remedy(tmp_path):
    model = _model_file(tmp_path, "def build_model():\n    return nn.Sequential()\n"
                                  "def example_batch(n):\n    return torch.randn(n, 8), torch.randn(n, 4)\n")
    _refused(_invoke("profile", model, *FAST, "--out", tmp_path / "p.json"),
             "no pipeline layers; build_model() must return an nn.Sequential with at least one child")


# ---------------------------------------------------------------- 2, 10: files that hang or exit


def test_a_model_file_that_loops_at_import_is_stopped_by_the_timeout(tmp_path):
    out = tmp_path / "p.json"
    result = _invoke("profile", FIXTURES / "loops_at_import.py", "--timeout", "0.5", "--out", out)
    output = _refused(result, "importing model file", "did not finish within 0.5 s (--timeout)")
    assert "line 8 of loops_at_import.py: `while True:`" in output or "line 9 of loops_at_import.py: `count += 1`" in output
    assert not out.exists()


@pytest.mark.parametrize(
    "build, example, what",
    [
        ("    while True:\n        pass\n", "    return torch.randn(n, 2), torch.randn(n, 2)\n", "build_model()"),
        ("    return nn.Sequential(nn.Linear(2, 2))\n", "    import time\n    time.sleep(3600)\n", "example_batch()"),
    ],
)
def test_build_model_or_example_batch_that_hangs_is_stopped(tmp_path, build, example, what):
    model = _model_file(tmp_path, f"def build_model():\n{build}def example_batch(n):\n{example}")
    _refused(_invoke("profile", model, "--timeout", "0.3", "--out", tmp_path / "p.json"),
             f"{what} did not finish within 0.3 s", "of m.py")


def test_the_timer_is_gone_after_the_command(tmp_path):
    import signal

    result = _invoke("profile", FIXTURES / "tiny.py", *FAST, "--timeout", "30", "--out", tmp_path / "p.json")
    assert result.exit_code == 0, result.output
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.default_int_handler, None)


def test_a_model_file_that_exits_at_import_gets_a_sentence(tmp_path):
    _refused(_invoke("profile", FIXTURES / "exits_at_import.py", "--out", tmp_path / "p.json"),
             "called sys.exit(0) while being imported", "must return, not exit")


def test_build_model_that_exits_gets_a_sentence(tmp_path):
    model = _model_file(tmp_path, "def build_model():\n    sys.exit('no GPU')\n"
                                  "def example_batch(n):\n    return torch.randn(n, 2), torch.randn(n, 2)\n")
    _refused(_invoke("profile", model, "--out", tmp_path / "p.json"), "build_model() called sys.exit('no GPU')")


def test_a_layer_that_exits_while_profiling_gets_a_sentence(tmp_path):
    model = _model_file(tmp_path, "class Quit(nn.Module):\n    calls = 0\n"
                                  "    def forward(self, x):\n        Quit.calls += 1\n"
                                  "        if Quit.calls > 3:\n            sys.exit(3)\n        return x\n"
                                  "def build_model():\n    return nn.Sequential(nn.Linear(2, 2), Quit())\n"
                                  "def example_batch(n):\n    return torch.randn(n, 2), torch.randn(n, 2)\n")
    _refused(_invoke("profile", model, *FAST, "--out", tmp_path / "p.json"), "called sys.exit(3) while profiling")


# ---------------------------------------------------------------- the chain against the model's forward()

CHAIN_MODEL = """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.pos = nn.Parameter(torch.randn(6, 8))
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.head = nn.Linear(8, 16)

    def pipeline_layers(self):
        return [("embed", self.embed), ("blocks.0", self.blocks[0]), ("blocks.1", self.blocks[1]), ("head", self.head)]

    def forward(self, ids):
        x = self.embed(ids) + POSITIONS * self.pos
        for block in self.blocks:
            x = block(x)
        return {"logits": self.head(x)}

def build_model():
    return Model()

def example_batch(n):
    ids = torch.randint(0, 16, (n, 6))
    return ids, ids
"""


def test_a_chain_that_drops_what_forward_adds_is_refused(tmp_path):
    model = _model_file(tmp_path, "POSITIONS = 1\n" + CHAIN_MODEL)
    _refused(_invoke("profile", model, *FAST, "--out", tmp_path / "p.json"),
             "the layer chain's output differs from Model.forward() on example_batch()",
             "pipeline_layers() must cover every step of forward()")


def test_a_chain_that_matches_forward_profiles(tmp_path):
    model = _model_file(tmp_path, "POSITIONS = 0\n" + CHAIN_MODEL)
    result = _invoke("profile", model, *FAST, "--out", tmp_path / "p.json")
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output


class _Chain(nn.Module):
    def __init__(self, forward_shape=None):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Dropout(0.5)
        self.forward_shape = forward_shape

    def pipeline_layers(self):
        return [("a", self.a), ("b", self.b)]

    def forward(self, x):
        out = self.b(self.a(x))
        return out if self.forward_shape is None else out.reshape(self.forward_shape)


def test_forward_check_runs_in_eval_mode_and_restores_train_mode():
    model = _Chain().train()
    model.a.eval()  # a mixed state must come back as it was
    assert modelfile.forward_mismatch(model, model.pipeline_layers(), torch.randn(3, 4)) is None
    assert model.training and model.b.training and not model.a.training


def test_forward_with_another_shape_is_refused():
    model = _Chain(forward_shape=(4, 3))
    with pytest.raises(UserError, match=r"returns shape \(3, 4\) but _Chain.forward\(\) returns \(4, 3\)"):
        modelfile.forward_mismatch(model, model.pipeline_layers(), torch.randn(3, 4), "m.py")


def test_sequential_is_not_compared_with_itself():
    class Loud(nn.Sequential):
        pass

    assert modelfile.forward_mismatch(nn.Sequential(nn.Linear(2, 2)), [], torch.randn(1, 2)) is None
    assert modelfile.forward_mismatch(Loud(nn.Linear(2, 2)), [], torch.randn(1, 2)) is None


def test_layers_that_checkpoint_inside_are_found():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    inner = nn.Linear(2, 2)
    inner.gradient_checkpointing = True  # what Hugging Face's gradient_checkpointing_enable() sets
    layers = [("a", nn.Sequential(inner)), ("b", nn.Linear(2, 2)), ("c", checkpoint_wrapper(nn.Linear(2, 2)))]
    assert modelfile.checkpointed_inside(layers) == ["a", "c"]


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated")
def test_profile_warns_about_hugging_face_gradient_checkpointing(tmp_path):
    transformers = pytest.importorskip("transformers")  # optional: random weights from a config, no download
    model = tmp_path / "hf.py"
    model.write_text(
        "import torch\nfrom torch import nn\nfrom transformers import GPT2Config, GPT2Model\n"
        "class Block(nn.Module):\n    def __init__(self, block):\n        super().__init__()\n"
        "        self.block = block\n    def forward(self, x):\n        out = self.block(x)\n"
        "        return out[0] if isinstance(out, tuple) else out\n"
        "def build_model():\n"
        "    hf = GPT2Model(GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=2, n_head=2))\n"
        "    hf.gradient_checkpointing_enable()\n"
        "    return nn.Sequential(*(Block(b) for b in hf.h))\n"
        "def example_batch(n):\n    return torch.randn(n, 8, 16), torch.randn(n, 8, 16)\n"
    )
    result = _invoke("profile", model, *FAST, "--out", tmp_path / "p.json")
    assert result.exit_code == 0, result.output
    assert "layers 0, 1 already checkpoint inside themselves" in result.output, transformers.__version__


def test_launch_dp_that_the_shard_group_does_not_divide_says_why_without_a_url(tmp_path):
    from fixtures.rt_plans import make_plan

    from planner.commands.launch import with_dp
    from planner.errors import UserError

    plan = make_plan(FIXTURES / "tiny.py", [["0", "1"], ["2", "3", "4"]])
    plan = plan.model_copy(update={"setup": plan.setup.model_copy(update={"dp": 4, "zero": 1, "shard_group": 2})})
    assert with_dp(plan, 6).setup.data_parallel.dp == 6
    with pytest.raises(UserError) as info:
        with_dp(plan, 3)
    assert "shard_group 2 does not divide dp 3" in str(info.value) and "http" not in str(info.value)


@pytest.mark.parametrize("command", ["launch", "validate", "compare", "calibrate"])
def test_a_plan_scored_for_a_frameworks_runtime_is_not_run_here(tmp_path, command):
    # its predictions are Megatron-LM's pipeline and checkpointing: compared with ckplan's own
    # runtime they would be silently wrong
    plan = make_plan(FIXTURES / "tiny.py", [["0", "1"], ["2"]])
    plan = plan.model_copy(update={"setup": plan.setup.model_copy(update={"runtime": "megatron"})})
    path = tmp_path / "plan.yaml"
    io.save_plan(plan, path)
    _refused(_invoke(command, path), "scored for megatron's runtime", "--runtime ckplan")
