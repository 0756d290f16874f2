#!/usr/bin/env bash
# The test suite, from nothing: sets up .venv with the dev extras, then runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
exec .venv/bin/python -m pytest "$@"
