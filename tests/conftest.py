import os
import pathlib
import tempfile

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = ROOT / "configs" / "models"


TERMINAL_VARIABLES = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """(pytest-xdist, in the controller) Each worker is handed this process's COLUMNS and LINES:
    a worker starts with COLUMNS=80 and LINES=24 set (pytest-xdist 3.8.0 over execnet 2.1.2),
    and ckplan's console fits its sentences to COLUMNS, so a one-sentence error wrapped past the
    tests' line counts under xdist only."""
    node.workerinput["terminal"] = {name: os.environ.get(name) for name in TERMINAL_VARIABLES}


def pytest_configure(config):
    for name, value in getattr(config, "workerinput", {}).get("terminal", {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):  # a pytest-xdist worker (scripts/test.sh)
        # the multi-process tests, the longest, start first: one started last would leave a
        # worker running it alone at the end (a stable sort: each file's order is kept)
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def temporary_folder(tmp_path_factory):
    """Every temporary file of the session under pytest's own folder (which keeps the last three
    sessions' alone), not the real one: a failed launch copies its rank's log into a folder of
    its own for the user (launcher._keep_log, tempfile.mkdtemp), and the failing-launch tests
    left hundreds of /tmp/ckplan-failed-*. tempfile reads `tempdir` in this process, TMPDIR in
    the processes it starts (ranks, ckplan as its own process). Yields (this folder, the real
    one)."""
    real = pathlib.Path(tempfile.gettempdir())
    folder = tmp_path_factory.mktemp("tmp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tempfile, "tempdir", str(folder))
        patch.setenv("TMPDIR", str(folder))
        yield folder, real


@pytest.fixture(scope="session", autouse=True)
def _profile_alone():
    """`ckplan profile` times the model beside a copy on every other core (a process that
    loads the model file: seconds each); tests that profile for another reason skip it,
    module- and session-scoped fixtures too (they are set up before any function's
    monkeypatch). Yields how many copies `profile` starts otherwise."""
    import planner.profiler.threads as threads

    copies = threads.MAX_COPIES
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(threads, "MAX_COPIES", 1)
        yield copies


@pytest.fixture(autouse=True)
def _copies_where_marked(request, _profile_alone, monkeypatch):
    """Tests marked `copies` profile beside the copies, as a user's profile does."""
    if "copies" in request.keywords:
        monkeypatch.setattr("planner.profiler.threads.MAX_COPIES", _profile_alone)


@pytest.fixture
def one_thread():
    """torch at one thread in this process for the test, as `profile --threads 1` runs: for tests that
    measure in process and read bytes, which are the same at any thread count. torch's default, a
    thread a core, spins on a busy machine: test_profiler.py and test_kept_bytes.py took 145 CPU-s
    at the default and 9 at one thread on this 2-core machine (docs/testing.md, session 66)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class _SharedRankServer:
    """Stands in for launcher.RankServer: every local run in this test process forks its ranks
    from one server (started at the first run), rather than starting a server, and importing
    torch in it, per run. What a rank sees is the same either way (test_forkserver.py); the
    per-run server itself is proved where ckplan runs as its own process (test_forkserver,
    test_no_orphans, test_faults, test_runtime_pipeline's killed launcher)."""

    def __init__(self, server_class):
        self._class, self._server = server_class, None

    def available(self) -> bool:
        return self._class.available()

    def __call__(self, **kwargs):
        if self._server is None or not self._server.running():
            self._server = self._class(**kwargs)
        return _Borrowed(self._server)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


class _Borrowed:
    def __init__(self, server):
        self.start = server.start

    def close(self) -> None:  # the server outlives the run: _one_rank_server closes it
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


@pytest.fixture(scope="session", autouse=True)
def _one_rank_server():
    import planner.runtime.launcher as launcher

    shared = _SharedRankServer(launcher.RankServer)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(launcher, "RankServer", shared)
        yield shared
    shared.close()


@pytest.fixture(scope="session")
def llama_style_profiles(tmp_path_factory):
    """tests/fixtures/llama_style.py profiled at the command's defaults, measured (one thread, one repeat, no
    warmup) and fake (--device cpu): (measured path, fake path, the fake run's output), read only. Shared by
    the tests that read these (test_fake's byte-for-byte comparison, test_analytic_records' records,
    test_fake_split_bytes' split fields, test_wgroups' ZBV run), each marked
    `xdist_group("llama_style_profiles")` so one worker profiles once."""
    from fixtures.cli import run_ok

    folder = tmp_path_factory.mktemp("llama_style")
    model = "tests/fixtures/llama_style.py"
    run_ok("profile", model, "--threads", "1", "--repeats", "1", "--warmup", "0", "--out", folder / "m.json")
    result = run_ok("profile", model, "--fake", "--device", "cpu", "--out", folder / "f.json")
    return folder / "m.json", folder / "f.json", result.output


LLAMA3_8B_LAYER = {"model_type": "llama", "num_hidden_layers": 1, "vocab_size": 128256, "max_position_embeddings": 8192,
                   "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8}


@pytest.fixture(scope="session")
def llama3_8b_layer_fake(tmp_path_factory):
    """One LLaMA 3 8B decoder layer at full width (LLAMA3_8B_LAYER's config.json) and its fake profile at 4096
    tokens, one sample (`--hf-config FOLDER --fake`, an H100 in bfloat16 by default): (config.json, fake profile
    path), read only. Shared by test_fake's check against the formulas and test_roofline's against the analytic
    profile, each marked `xdist_group("llama3_8b_layer_fake")` so one worker profiles once."""
    import json

    from fixtures.cli import run_ok

    config = tmp_path_factory.mktemp("llama3-8b") / "config.json"
    config.write_text(json.dumps(LLAMA3_8B_LAYER))
    run_ok("profile", "--hf-config", config.parent, "--fake", "--seq-len", "4096", "--micro-batch-size", "1",
           "--out", config.parent / "f.json")
    return config, config.parent / "f.json"
