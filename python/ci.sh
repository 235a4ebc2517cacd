#!/usr/bin/env bash
# CI for the Python package on a CPU-only machine (scripts/test calls it after the C++
# build): into the project's virtual environment build/venv (scripts/venv), installs the
# build tools from PyPI and `pip install .` (library + extension only; it links
# build/libmoekit.a when scripts/test has just built it, instead of compiling the CUDA
# library a second time), then runs pytest on python/tests. Tests that need PyTorch or a
# Hopper GPU skip; one summary line per reason counts them. The raw-binding tests run.
# Exits with pytest's code; 5 ("no tests collected") is a failure like any non-zero code.
#   PYTHON=python3.12 python/ci.sh     # another interpreter (installs into it, no venv)
#   MOEKIT_PY_REBUILD=1 python/ci.sh   # compile the library inside the pip build
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export PATH="/usr/local/cuda/bin:$PATH"
PY=${PYTHON:-$(scripts/venv)}
pip_q=(-q --disable-pip-version-check --no-input)

"$PY" -m pip install "${pip_q[@]}" "scikit-build-core>=0.10" "nanobind>=2.0" pytest numpy

# Reuse the top-level build's static library when it is at least as new as every source.
if [ -z "${MOEKIT_PYTHON_PREBUILT_LIB:-}" ] && [ "${MOEKIT_PY_REBUILD:-0}" != 1 ] &&
  [ -f build/libmoekit.a ] &&
  [ -z "$(find src include cmake CMakeLists.txt -newer build/libmoekit.a -print -quit)" ]; then
  export MOEKIT_PYTHON_PREBUILT_LIB="$root/build/libmoekit.a"
  echo "python/ci.sh: linking the prebuilt $MOEKIT_PYTHON_PREBUILT_LIB"
fi
echo "python/ci.sh: pip install . ($("$PY" --version))"
"$PY" -m pip install "${pip_q[@]}" --no-cache-dir --no-build-isolation --force-reinstall --no-deps .

# Run from the tests folder so that `import moekit` finds the installed package. The
# skip reasons (-rs) are summarized after the run instead of listed.
cd python/tests
log=$(mktemp)
set +e
"$PY" -m pytest -q -rfEs -p no:cacheprovider . 2>&1 | tee "$log" | grep --line-buffered -v '^SKIPPED \['
rc=${PIPESTATUS[0]}
set -e
"$PY" "$root/scripts/skip-summary" pytest "$log" || true
rm -f "$log"
if [ "$rc" -eq 5 ]; then
  echo "python/ci.sh: pytest collected no tests" >&2
fi
exit "$rc"
