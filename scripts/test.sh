#!/usr/bin/env bash
# The test suite, from nothing: sets up .venv with the dev extras, then runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
# Optional test dependencies: transformers (Hugging Face models built from a config, random
# weights) and the frameworks ckplan exports to. Neither may replace the torch in .venv:
# transformers is held to it by a constraint, the frameworks install without dependencies.
# Where an install fails, the tests that need it skip.
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
TORCH_PIN=$(mktemp)
trap 'rm -f "$TORCH_PIN"' EXIT
.venv/bin/python -c "import torch; print(f'torch=={torch.__version__}')" > "$TORCH_PIN"
quiet() { grep -v -e "is ignored: it is neither a file nor a directory" -e "which is not installed" \
  -e "which is incompatible" -e "dependency conflicts" -e "^ERROR: pip's dependency resolver" >&2 || true; }
"${PIP[@]}" install -c "$TORCH_PIN" "transformers>=4.40" 2> >(quiet) \
  || echo "setup: transformers not installed; its tests will skip"
DS_BUILD_OPS=0 "${PIP[@]}" install --no-deps --no-build-isolation -r scripts/test-frameworks.txt 2> >(quiet) \
  || echo "setup: framework packages not installed; their export tests will skip"
# ckplan and the tests byte-compiled once: the suite starts hundreds of Python processes (ranks,
# CLI runs, copies), and where PYTHONDONTWRITEBYTECODE is set each compiled every ckplan module it
# imported again (0.7 of the 5.7 CPU seconds a rank takes to import here). Only speed rests on it.
.venv/bin/python -m compileall -q planner tests scripts >/dev/null || echo "setup: byte-compiling failed; the tests run without it"
# On every core (pytest-xdist, from the dev extras): one worker per logical CPU, at most 4, since
# the multi-process tests start 2 to 4 ranks each. --dist loadgroup keeps the tests marked
# xdist_group(NAME) on one worker, so the module-scoped profile or launch they share runs once.
# Options given to this script come after these and win (-n 0: one process, as plain pytest runs).
.venv/bin/python -m pytest -n logical --maxprocesses 4 --dist loadgroup "$@"
