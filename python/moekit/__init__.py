"""moekit: Mixture-of-Experts kernels for NVIDIA Hopper (sm_90a).

Two layers:

- ``moekit.raw`` (always available, no torch needed): the nanobind binding of the
  C++ API. Tensors are ``(data_ptr, dtype_code, shape[, strides])`` tuples, DLPack
  CUDA tensors or ``None``; the caller allocates outputs and workspaces and passes
  the CUDA stream as an int.
- The PyTorch ops (registered when torch can be imported): ``moekit.fused_topk``,
  ``moekit.fused_moe``, ... (the same functions live in ``moekit.ops``), each also
  a ``torch.library`` custom op ``torch.ops.moekit.<name>`` with a fake (meta)
  implementation, so ``torch.compile`` and CUDA-graph capture work. Outputs and
  workspaces come from PyTorch's caching allocator (``out=`` takes the caller's
  output buffers instead); kernels run on the current CUDA stream.

Bad input raises ``moekit.MoekitError`` (a ``ValueError``) carrying the C++ message
``moekit::<op>: argument '<name>': expected ..., got ...``.

Set ``MOEKIT_NO_TORCH=1`` to skip the torch layer even where torch is installed.
"""

import importlib.util as _ilu
import os as _os

from . import _moekit as raw
from ._moekit import DTYPES, OPS, MoekitError, __version__

__all__ = ["raw", "MoekitError", "DTYPES", "OPS", "__version__", "HAS_TORCH"]

HAS_TORCH = False
if not _os.environ.get("MOEKIT_NO_TORCH") and _ilu.find_spec("torch") is not None:
    from . import ops  # noqa: E402  registers torch.ops.moekit.*
    from .ops import *  # noqa: F401,F403,E402

    __all__ += list(ops.__all__) + ["ops"]
    HAS_TORCH = True


def __getattr__(name):
    # A clear message instead of AttributeError for the torch ops when torch is absent.
    if name in OPS or name == "ops":
        where = "moekit.raw" if name == "ops" else "moekit.raw." + name
        raise ImportError(
            f"moekit.{name} needs PyTorch (not importable here, or MOEKIT_NO_TORCH is set); "
            f"the raw binding is {where}"
        )
    raise AttributeError(f"module 'moekit' has no attribute {name!r}")
