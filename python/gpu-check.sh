#!/usr/bin/env bash
# The Python package on an H100/H200 machine with PyTorch (scripts/gpu-check calls it):
# makes moekit importable (python/install-local.sh: a carried wheel, else a build of this
# checkout), runs the CPU-level tests and the GPU tests (two pytest processes), then
# measures the host overhead per call and splits it per op (python/tools/overhead.py
# --attribute). Logs and JSON go to
# $MOEKIT_PY_OUT (default build-python/gpu-check). Last line:
#   python gpu-check: N passed, N failed, N skipped
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PY=${PYTHON:-python3}
out=${MOEKIT_PY_OUT:-$root/build-python/gpu-check}
mkdir -p "$out"
site=$(python/install-local.sh) || {
  echo "python gpu-check: 0 passed, 1 failed, 0 skipped (install failed)"
  exit 1
}
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import torch, moekit; print('torch', torch.__version__, '| moekit', moekit.__version__,
'| GPU', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"

pass=0 fail=0 skip=0
count() {  # adds the counts of pytest's closing line in $1
  local line
  line=$(tail -1 "$1")
  p=$(grep -Eo '[0-9]+ passed' <<<"$line" | grep -Eo '[0-9]+' || echo 0)
  f=0
  for n in $(grep -Eo '[0-9]+ (failed|errors?)' <<<"$line" | grep -Eo '[0-9]+'); do f=$((f + n)); done
  s=$(grep -Eo '[0-9]+ skipped' <<<"$line" | grep -Eo '[0-9]+' || echo 0)
  pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
}
timeout=()  # a hung test must not eat the whole session
if "$PY" -c "import pytest_timeout" 2>/dev/null; then timeout=(--timeout=120); fi
cd python/tests
PYTHONUNBUFFERED=1 "$PY" -m pytest -q -rs -p no:cacheprovider "${timeout[@]}" test_binding.py test_binding_quant.py test_torch_cpu.py \
  test_reference.py test_torch_alternatives.py 2>&1 | tee "$out/pytest-cpu.log"
rc1=${PIPESTATUS[0]}
count "$out/pytest-cpu.log"
PYTHONUNBUFFERED=1 "$PY" -m pytest -q -rs -p no:cacheprovider "${timeout[@]}" test_ops_gpu.py test_ops_fp8_gpu.py \
  test_vllm_integration.py 2>&1 |
  tee "$out/pytest-gpu.log"
rc2=${PIPESTATUS[0]}
count "$out/pytest-gpu.log"
if [ "$rc1" -ne 0 ] && [ "$fail" -eq 0 ]; then fail=$((fail + 1)); fi  # crashed or collected nothing
if [ "$rc2" -ne 0 ] && [ "$fail" -eq 0 ]; then fail=$((fail + 1)); fi
if [ "${MOEKIT_PY_SKIP_OVERHEAD:-0}" != 1 ]; then
  # --attribute: the eager path's split per op after the tables (~10-20 s more)
  timeout 90 "$PY" ../tools/overhead.py --attribute --json "$out/overhead.json" 2>&1 |
    tee "$out/overhead.txt"
fi
echo "python gpu-check: $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
