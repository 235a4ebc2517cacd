"""Shared helpers for moekit's Python tests: what this machine can run, and why not."""

import os

import pytest

import moekit

try:
    import torch
except ImportError:  # the raw-binding tests still run
    torch = None

HAS_TORCH = torch is not None and moekit.HAS_TORCH

# MOEKIT_TEST_SELFCHECK=1 runs the GPU test bodies on the CPU against the references
# themselves (torch_reference via ref_ops): it checks the test harness, not moekit.
SELFCHECK = os.environ.get("MOEKIT_TEST_SELFCHECK") == "1"


def torch_skip_reason():
    if torch is None:
        return "PyTorch is not installed (the raw-binding tests cover the package without it)"
    if not moekit.HAS_TORCH:
        return "moekit's torch layer is off (MOEKIT_NO_TORCH is set)"
    return None


def gpu_skip_reason():
    reason = torch_skip_reason()
    if reason or SELFCHECK:
        return reason
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to PyTorch (these tests need an sm_90 Hopper GPU)"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"needs an sm_90 (Hopper) GPU; this one is sm_{major}{minor}"
    return None


requires_torch = pytest.mark.skipif(torch_skip_reason() is not None,
                                    reason=str(torch_skip_reason()))  # fmt: skip
requires_gpu = pytest.mark.skipif(gpu_skip_reason() is not None, reason=str(gpu_skip_reason()))
requires_real_gpu = pytest.mark.skipif(
    SELFCHECK or gpu_skip_reason() is not None,
    reason="self-check mode (no GPU)" if SELFCHECK else str(gpu_skip_reason()),
)

DEVICE = "cpu" if SELFCHECK else "cuda"


@pytest.fixture
def stubbed_devices(monkeypatch):
    """A fixture (needs torch): CPU tensors stand in for CUDA ones on the eager path, the
    device checks stubbed (test_torch_cpu.py's test_the_torch_layer_passes_valid_arguments
    says why); yields moekit.ops."""
    o = moekit.ops
    monkeypatch.setattr(o, "_device", lambda op, names, *ts: 0)
    monkeypatch.setattr(o, "_launch_ctx", lambda t: (-1, 0))
    monkeypatch.setattr(o, "_is_capturing", lambda stream: False)
    monkeypatch.setattr(o, "_eager", lambda first: True)
    old = moekit.raw._set_device_check(False)
    yield o
    moekit.raw._set_device_check(old)
    o.release_workspaces()
