// Measured ceilings (B_peak and F_peak of the SOL column), cached per device.
#pragma once

#include <string>

#include "blas.h"
#include "device.h"
#include "model.h"

namespace moekit::bench {

// The cache file for a device: `explicit_path` if set, else $MOEKIT_BENCH_CACHE, else
// $XDG_CACHE_HOME/moekit or ~/.cache/moekit (or /tmp/moekit) / ceilings-<uuid>.json.
std::string ceilings_cache_path(const std::string& explicit_path, const Device& dev);

// Measures the three ceilings now; `failed` names the ones that fell back to nominal.
Ceilings measure_ceilings(const Device& dev, Blas& blas, cudaStream_t stream, std::string* failed);

// Reads the cache when it holds this device's figures (and !remeasure); otherwise
// measures: a streaming read over 4 GiB (16-byte loads, 4 in flight per thread, 2-4
// blocks per SM: best median), cuBLAS bf16 8192^3 and cuBLASLt fp8 8192^3 (medians of
// 20 calls on N(0,1) data), and writes the cache. Failures fall back to the nominal
// figures for that ceiling, saying so in `source`.
Ceilings get_ceilings(const Device& dev, Blas& blas, const std::string& cache_path, bool remeasure,
                      cudaStream_t stream);

}  // namespace moekit::bench
