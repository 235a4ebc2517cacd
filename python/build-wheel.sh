#!/usr/bin/env bash
# Builds a moekit wheel of this checkout into build-python/dist/ (ignored by git), for
# carrying to a GPU machine whose Python differs from this machine's default: the H200
# machines run CPython 3.12, so by default this uses a local python3.12 (pyenv's, if any).
#   PYTHON=/path/to/python3.12 python/build-wheel.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  # pyenv's python3.12 shim fails unless 3.12 is the active version: prefer the real binary.
  PY=$(ls -d "$HOME"/.pyenv/versions/3.12*/bin/python 2>/dev/null | tail -1 || true)
  [ -n "$PY" ] || PY=$(command -v python3.12 || true)
fi
[ -n "$PY" ] || { echo "build-wheel: no python3.12 found; set PYTHON" >&2; exit 1; }
# The build tools go to a virtual environment of that Python under build/, not into it.
tag=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
PY=$(PYTHON="$PY" MOEKIT_VENV="$PWD/build/venv-py$tag" scripts/venv)
"$PY" -m pip install -q --disable-pip-version-check "scikit-build-core>=0.10" "nanobind>=2.0"
if [ -z "${MOEKIT_PYTHON_PREBUILT_LIB:-}" ] && [ -f build/libmoekit.a ] &&
  [ -z "$(find src include cmake CMakeLists.txt -newer build/libmoekit.a -print -quit)" ]; then
  export MOEKIT_PYTHON_PREBUILT_LIB="$PWD/build/libmoekit.a"
fi
rm -rf build-python/dist
"$PY" -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps \
  -w build-python/dist .
ls build-python/dist/*.whl
