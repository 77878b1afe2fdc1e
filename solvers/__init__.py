"""graphsolve-cuda: iterative solvers whose whole solve is one CUDA graph launch.

The package imports and runs without CuPy (CPU path); the GPU path is used
when CuPy and a CUDA device are present.
"""
__version__ = "0.1.0"
DISTRIBUTION = "graphsolve-cuda"

from .errors import DeviceError, InputError  # noqa: E402
from .pcg import PCG, BatchedPCG, BatchResult, Reason, SolveResult, cg  # noqa: E402

__all__ = ["cg", "PCG", "BatchedPCG", "BatchResult", "Reason", "SolveResult", "InputError", "DeviceError"]
