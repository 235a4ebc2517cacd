#!/usr/bin/env bash
# Runs moekit-bench (default: build/bench/moekit-bench; override with MOEKIT_BENCH_BIN),
# first pointing the loader at PyTorch's cuBLAS (site-packages/nvidia/cublas/lib)
# when the system has no libcublas on its path. Arguments go to moekit-bench.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${MOEKIT_BENCH_BIN:-$here/../build/bench/moekit-bench}"
if [ ! -x "$bin" ]; then
  echo "run.sh: $bin not found (build the moekit-bench target, or set MOEKIT_BENCH_BIN)" >&2
  exit 1
fi
if ldd "$bin" 2>/dev/null | grep -q "libcublas.*not found"; then
  for py in python3 python; do
    dir=$("$py" -c 'import nvidia.cublas as c, os; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null) || continue
    if [ -d "$dir" ]; then
      export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      echo "run.sh: using cuBLAS from $dir" >&2
      break
    fi
  done
fi
exec "$bin" "$@"
