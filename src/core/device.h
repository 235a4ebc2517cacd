// The current device's properties, queried once per device in one place: the planners'
// only view of the hardware (they take a DeviceProps, so CPU tests pass made-up ones).
#pragma once

#include <string>

namespace moekit::detail {

struct DeviceProps {
  int arch = 0;  // compute capability major * 10 + minor (90 on H100 / H200)
  int sms = 0;   // streaming multiprocessors
  // Kernels may read pageable host memory (cudaDevAttrPageableMemoryAccess: HMM or ATS).
  bool pageable_access = false;
  // The hand-written Hopper kernels (TMA, wgmma, clusters) are built for sm_90a only.
  bool sm90() const { return arch == 90; }
};

// An H200 (132 SMs): for planner tests.
DeviceProps h200_props();

// The current device's (cudaGetDevice), cached per device. Without a usable device:
// all zeros (arch 0: the planners then pick only what runs anywhere).
const DeviceProps& device_props();

// The current device's name (cudaDeviceProp::name, the tuning tables' key), cached per
// device; empty without a usable device.
const std::string& device_name();

// The per-device caches hold devices 0 .. kMaxDevices - 1.
constexpr int kMaxDevices = 64;

// The current device (cudaGetDevice), or -1 without one or past kMaxDevices (the CUDA
// error cleared).
int current_device();

// A per-device cache of one integer the owner measures once (for example a kernel's
// co-resident clusters, cudaOccupancyMaxActiveClusters): slot in [0, kDeviceCacheSlots).
// query() runs at most once per (device, slot); thread-safe.
constexpr int kDeviceCacheSlots = 64;
int device_cached(int slot, int (*query)());

// The device_cached slots, one per measured quantity (49..56: the split-K kernel's
// co-resident clusters per split, gemm_planner.h kSplitKClusterSlot).
enum DeviceSlot : int {
  kSlotSm90PairClusters = 0,   // the paired SM90 GEMM kernels' co-resident 2-CTA clusters
  kSlotSm90ChainPairClusters,  // the expert-MLP chain's on pair tiles
  kSlotCount
};
static_assert(kSlotCount <= kDeviceCacheSlots, "device_cached slots");

}  // namespace moekit::detail
