#!/usr/bin/env bash
# Makes the moekit Python package importable without touching site-packages: installs a
# wheel from build-python/dist (one built elsewhere for this Python, e.g. carried to a GPU
# machine) or builds this checkout (linking build/libmoekit.a when present) into
# build-python/site. Prints the folder to put on PYTHONPATH.
#   export PYTHONPATH=$(python/install-local.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export PATH="/usr/local/cuda/bin:$PATH"
PY=${PYTHON:-python3}
site=${MOEKIT_PY_SITE:-$root/build-python/site}
tag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
wheel=$(ls build-python/dist/moekit-*-"$tag"-*.whl 2>/dev/null | tail -1 || true)
rm -rf "$site"
mkdir -p "$site"
if [ -n "$wheel" ]; then
  echo "install-local: $wheel" >&2
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheel" >&2
else
  lib="${MOEKIT_BUILD_DIR:-build}/libmoekit.a"  # scripts/gpu-check's build folder
  if [ -z "${MOEKIT_PYTHON_PREBUILT_LIB:-}" ] && [ -f "$lib" ]; then
    export MOEKIT_PYTHON_PREBUILT_LIB="$(cd "$(dirname "$lib")" && pwd)/libmoekit.a"
  fi
  echo "install-local: building ($("$PY" --version), prebuilt lib: ${MOEKIT_PYTHON_PREBUILT_LIB:-none})" >&2
  # With $PY's own build tools where it has them, else from a virtual environment made
  # from it (build/venv-pyXY, scripts/venv): nothing is installed into $PY itself.
  build_py=$PY
  if ! "$PY" -c "import scikit_build_core, nanobind" >/dev/null 2>&1; then
    ver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
    build_py=$(PYTHON="$PY" MOEKIT_VENV="$root/build/venv-py$ver" scripts/venv)
    "$build_py" -m pip install -q --disable-pip-version-check "scikit-build-core>=0.10" \
      "nanobind>=2.0" >&2
  fi
  "$build_py" -m pip install -q --no-build-isolation --no-deps --target "$site" . >&2
fi
echo "$site"
