// moekit: Mixture-of-Experts kernels for NVIDIA Hopper. One include for the whole API.
#pragma once

#include "moekit/error.h"
#include "moekit/gemm.h"
#include "moekit/moe.h"
#include "moekit/permute.h"
#include "moekit/plan.h"
#include "moekit/quant.h"
#include "moekit/routing.h"
#include "moekit/tensor.h"
#include "moekit/tuning.h"
#include "moekit/version.h"
