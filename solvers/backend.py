"""Device discovery: which array backend a run uses.

Everything here imports CuPy lazily, so the package imports and runs on
machines without it.
"""
import functools
import os

import numpy as np

from .errors import DeviceError


@functools.lru_cache(maxsize=None)
def _probe_gpu():
    """Return ``(cupy_module, None)`` or ``(None, reason)``."""
    if os.environ.get("GRAPHSOLVE_DISABLE_GPU"):
        return None, "disabled by GRAPHSOLVE_DISABLE_GPU"
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install
        return None, f"CuPy is not importable ({type(exc).__name__}: {exc})".splitlines()[0]
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return None, f"no usable CUDA device ({exc})".splitlines()[0]
    if count < 1:
        return None, "no CUDA device found"
    return cupy, None


def gpu_available():
    """True when CuPy imports and sees at least one CUDA device."""
    return _probe_gpu()[0] is not None


def require_cupy():
    """Return the ``cupy`` module or raise :class:`DeviceError` saying why not."""
    cupy, reason = _probe_gpu()
    if cupy is None:
        raise DeviceError(f"GPU requested but unavailable: {reason}")
    return cupy


def resolve_device(device):
    """Map ``auto``/``cpu``/``gpu`` to ``(device, note)``.

    ``auto`` falls back to the CPU with a note when no GPU can be used;
    ``gpu`` raises :class:`DeviceError` instead.
    """
    if device not in ("auto", "cpu", "gpu"):
        raise ValueError(f"device must be auto, cpu or gpu, not {device!r}")
    if device == "cpu":
        return "cpu", None
    cupy, reason = _probe_gpu()
    if cupy is not None:
        return "gpu", None
    if device == "gpu":
        raise DeviceError(f"GPU requested but unavailable: {reason}")
    return "cpu", f"no GPU: {reason}; running on the CPU"


def is_device_array(obj):
    """True for arrays that live on a CUDA device (CuPy, PyTorch, JAX, ...)."""
    if hasattr(obj, "__cuda_array_interface__"):
        return True
    dl = getattr(obj, "__dlpack_device__", None)
    if dl is None:
        return False
    try:
        dev_type, _ = dl()
    except Exception:
        return False
    return int(dev_type) in (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged


def is_cupy_sparse(A):
    """True for a ``cupyx.scipy.sparse`` matrix (told by its type's module: CuPy is not imported)."""
    return type(A).__module__.startswith("cupyx.scipy.sparse")


def array_module(a):
    """NumPy for a host array, else CuPy (imported only for a device array)."""
    if isinstance(a, np.ndarray):
        return np
    import cupy
    return cupy
