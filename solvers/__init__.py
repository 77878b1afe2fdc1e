"""graphsolve: iterative solvers whose whole solve is one CUDA graph launch.

The package imports and runs without CuPy (CPU path); the GPU path is used
when CuPy and a CUDA device are present.
"""
from .errors import DeviceError, InputError
from .pcg import PCG, Reason, SolveResult, cg

__all__ = ["cg", "PCG", "Reason", "SolveResult", "InputError", "DeviceError"]
__version__ = "0.1.0"
