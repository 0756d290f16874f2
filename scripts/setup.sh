#!/usr/bin/env bash
# Creates .venv (or $CKPLAN_VENV) and installs ckplan into it, from nothing.
#
# torch: a torch the user already has is kept. If the interpreter that runs this
# script ($PYTHON, default python3) can import torch — installed system-wide, in a
# venv or a conda env — the new venv gets a .pth file naming the site-packages that
# holds it, so that torch (CUDA or not) is used and pip finds the requirement
# satisfied. Otherwise torch is pinned to $CKPLAN_TORCH (default torch==2.13.0), which
# on machines with a local CPU wheel resolves to it instead of pulling a multi-GB CUDA
# build from the index.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${CKPLAN_VENV:-.venv}
TORCH_SPEC=${CKPLAN_TORCH:-torch==2.13.0}
EXTRAS=${1:-}

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
  if USER_SITE=$("$PY" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))" 2>/dev/null); then
    echo "setup: using the torch already installed for $PY ($("$PY" -c 'import torch; print(torch.__version__)') in $USER_SITE)"
    VENV_SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    echo "$USER_SITE" > "$VENV_SITE/_ckplan_user_torch.pth"
  fi
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "setup: installing $TORCH_SPEC"
  "${PIP[@]}" install "$TORCH_SPEC" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
fi
# (the filter only hides a harmless warning some pip configurations print per package)
"${PIP[@]}" install -e ".${EXTRAS:+[$EXTRAS]}" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
"$VENV/bin/python" -c "import planner, torch; print(f'setup: ckplan {planner.__version__} with torch {torch.__version__} in $VENV')"
