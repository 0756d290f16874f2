"""What pytest's assertion rewriting costs each xdist worker at collection: every test module and
conftest is rewritten (its asserts expanded) and compiled as it is imported, and the rewritten code
is cached in __pycache__ only where bytecode may be written (not under PYTHONDONTWRITEBYTECODE, and
not at all on a clean clone's first run), so each worker of a CI run rewrites them all. Prints the
CPU seconds of rewriting every file under tests/ in this process, against compiling them plainly.

    python scripts/bench_collect_rewrite.py
"""

from __future__ import annotations

import pathlib
import resource

import _pytest.config
from _pytest.assertion.rewrite import _rewrite_test

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    files = sorted((ROOT / "tests").rglob("*.py"))
    config = _pytest.config.get_config()
    start = _cpu()
    for path in files:
        _rewrite_test(path, config)
    rewrite = _cpu() - start
    start = _cpu()
    for path in files:
        compile(path.read_bytes(), str(path), "exec")
    plain = _cpu() - start
    print(f"{len(files)} files under tests/: {rewrite:.2f} CPU-s rewritten and compiled, {plain:.2f} compiled plainly")


if __name__ == "__main__":
    main()
