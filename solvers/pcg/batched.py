"""Many independent SPD systems solved together: one kernel launch on the GPU, a loop over SciPy on the CPU.

The systems' matrices are stacked into one block-diagonal CSR matrix; on the GPU
one thread block (or one cluster, for systems of more than 2,048 rows) solves each
system with classic Jacobi PCG, its vectors in registers and shared memory and,
when it fits, its matrix in shared memory (``kernels/onchip.cu``; three systems of
1,024 rows share an SM): no system waits for another, and one that
breaks down or turns NaN is reported alone. A solve is one launch: the norms of
``b``, the tolerances and the true residuals are computed there, and the results
are read back once. The CPU path runs the same algorithm, system by system, with
the CPU solver (:func:`solvers.pcg.cpu.pcg_iterate`).
"""
import dataclasses
import time

import numpy as np
import scipy.sparse as sp

from ..backend import resolve_device
from ..errors import InputError
from ..kernels.structs import STATE
from .cpu import pcg_iterate
from .preconditioners import jacobi_inverse_diagonal
from .result import Reason, confirmed_each

PRECONDITIONERS = ("jacobi", "none")


@dataclasses.dataclass
class BatchResult:
    """Result of :meth:`BatchedPCG.solve`, one entry per system; also of
    :meth:`solvers.PCG.solve` with k right-hand sides, one entry per column of ``b``.

    Attributes
    ----------
    x : array or list of arrays
        The solutions: a ``(B, n)`` array (NumPy or CuPy) when every system has ``n``
        rows, else a list of B vectors; for k right-hand sides an ``(n, k)`` array.
    reasons : list of Reason
    iterations : ndarray of int
    residual_norms, true_residual_norms, b_norms, tolerances : ndarray
        The recursive and the recomputed ``||b - A x||``, ``||b||`` and the stopping
        threshold ``max(atol, rtol ||b||)`` of each system.
    setup_time, solve_time : float
        Seconds for the set-up (once per solver) and for this solve (all systems).
    device : str
    mode : str, optional
        The driver of a solve of k right-hand sides (``numpy``, ``eager``, ``graph``, ``while``).
    loop_time : float, optional
        Seconds of that solve's iteration loop (every column; on the GPU, graph launch to
        synchronisation, capture excluded).
    """

    x: object
    reasons: list
    iterations: np.ndarray
    residual_norms: np.ndarray
    true_residual_norms: np.ndarray
    b_norms: np.ndarray
    tolerances: np.ndarray
    setup_time: float
    solve_time: float
    device: str
    mode: str = None
    loop_time: float = None

    @property
    def converged(self):
        """True for each system that met its tolerance."""
        return np.array([r is Reason.CONVERGED for r in self.reasons])

    @property
    def info(self):
        """SciPy's ``info`` of each system (0 converged, > 0 not converged, < 0 breakdown)."""
        return np.array([r.info(it) for r, it in zip(self.reasons, self.iterations)])

    @property
    def time_per_iteration(self):
        """Loop time over the most iterations any system or column took (nan without a loop time)."""
        most = int(np.max(self.iterations)) if len(self.iterations) else 0
        return self.loop_time / most if self.loop_time is not None and most else float("nan")

    @property
    def relative_residuals(self):
        """``||b - A x|| / ||b||`` of each system (the absolute norm where ``b`` is zero, nan where it is not
        finite)."""
        with np.errstate(invalid="ignore"):  # inf / inf: a system stopped for its non-finite b
            return self.true_residual_norms / np.where(self.b_norms > 0, self.b_norms, 1.0)


def _as_csr(A, s):
    if not sp.issparse(A):
        A = np.asarray(A)
        if A.ndim != 2:
            raise InputError(f"system {s}: the matrix must be 2-D, got shape {A.shape}")
    if np.iscomplexobj(A.data if sp.issparse(A) else A):
        raise InputError(f"system {s}: complex matrices are not supported")
    A = sp.csr_matrix(A, dtype=np.float64)
    if A.shape[0] != A.shape[1]:
        raise InputError(f"system {s}: the matrix must be square, got shape {A.shape}")
    if A.shape[0] == 0:
        raise InputError(f"system {s}: the matrix is empty")
    if not np.all(np.isfinite(A.data)):
        raise InputError(f"system {s}: the matrix has NaN or Inf entries")
    A.sum_duplicates()
    return A


class BatchedPCG:
    """Preconditioned CG on B independent symmetric positive definite systems at once.

    Parameters
    ----------
    matrices : sequence of B matrices (sparse or dense)
        The systems' matrices; sizes and patterns may differ. See also
        :meth:`from_pattern` for one pattern with B value arrays.
    preconditioner : {"jacobi", "none"}
    rtol, atol : float
        Each system stops when ``||r_s|| <= max(atol, rtol ||b_s||)``.
    maxiter : int, optional
        Iteration limit of every system (default 10 times the largest size).
    device : {"auto", "cpu", "gpu"}
    """

    def __init__(self, matrices, *, preconditioner="jacobi", rtol=1e-5, atol=0.0, maxiter=None, device="auto"):
        t0 = time.perf_counter()
        if preconditioner not in PRECONDITIONERS:
            raise InputError(f"preconditioner must be one of {', '.join(PRECONDITIONERS)}, not {preconditioner!r}")
        blocks = [_as_csr(A, s) for s, A in enumerate(matrices)]
        if not blocks:
            raise InputError("no systems given")
        self.blocks = blocks
        self.sizes = np.array([A.shape[0] for A in blocks], dtype=np.int64)
        self.start = np.concatenate([[0], np.cumsum(self.sizes)])
        if self.start[-1] >= 2**31 - 1 or sum(A.nnz for A in blocks) >= 2**31 - 1:
            raise InputError("the systems together have 2^31 or more rows or entries (int32 indices)")
        self.preconditioner = preconditioner
        self.rtol, self.atol, self.maxiter = float(rtol), float(atol), maxiter
        self.inverse_diagonal = self._inverse_diagonal() if preconditioner == "jacobi" else None
        self.device, self.device_note = resolve_device(device)
        self._gpu = _GPUBatch(self) if self.device == "gpu" else None
        self.path = self._gpu.describe() if self._gpu is not None else "CPU: system by system"
        self.setup_time = time.perf_counter() - t0

    @classmethod
    def from_pattern(cls, pattern, values, **options):
        """B systems sharing the sparsity of ``pattern`` (CSR), with ``values[s]`` the entries of system s.

        ``values`` has shape ``(B, pattern.nnz)``, in the order of ``pattern.data``
        (CSR order after summing duplicates and sorting indices).
        """
        pattern = sp.csr_matrix(pattern)
        pattern.sum_duplicates()
        values = np.asarray(values, dtype=np.float64)
        if values.ndim != 2 or values.shape[1] != pattern.nnz:
            raise InputError(f"values must have shape (B, {pattern.nnz}), got {values.shape}")
        matrices = [sp.csr_matrix((v, pattern.indices, pattern.indptr), shape=pattern.shape) for v in values]
        return cls(matrices, **options)

    @property
    def systems(self):
        return len(self.blocks)

    def stacked(self):
        """The block-diagonal CSR matrix of all systems."""
        return sp.block_diag(self.blocks, format="csr")

    def _inverse_diagonal(self):
        parts = []
        for s, A in enumerate(self.blocks):
            try:
                parts.append(jacobi_inverse_diagonal(A.diagonal()))
            except InputError as exc:
                raise InputError(f"system {s}: {exc}") from None
        return np.concatenate(parts)

    def _right_hand_sides(self, b, name, xp=np):
        """``b`` as one stacked vector of ``xp`` (NumPy, or CuPy for the GPU: device input stays there),
        from a (B, n) array or a sequence of B vectors."""
        if xp is np and hasattr(b, "get"):
            b = b.get()
        if isinstance(b, np.ndarray) or hasattr(b, "__cuda_array_interface__"):
            b = xp.asarray(b)
        if getattr(b, "ndim", 0) == 2 and b.shape[0] == self.systems \
                and np.all(self.sizes == b.shape[1]):  # the common case, checked as a whole
            if b.dtype.kind not in "iuf":
                raise InputError(f"{name} must be real, got dtype {b.dtype}")
            return xp.ascontiguousarray(b, dtype=np.float64).reshape(-1)
        parts = list(b) if getattr(b, "ndim", 0) == 2 else [xp.asarray(v) for v in b]
        if len(parts) != self.systems:
            raise InputError(f"{name} has {len(parts)} systems, expected {self.systems}")
        for s, (v, n) in enumerate(zip(parts, self.sizes)):
            if v.shape != (n,):
                raise InputError(f"{name}: system {s} has shape {v.shape}, expected ({n},)")
            if v.dtype.kind not in "iuf":
                raise InputError(f"{name}: system {s} must be real, got dtype {v.dtype}")
        return xp.concatenate(parts).astype(np.float64)

    def _split(self, v):
        """Stacked vector -> (B, n) when the sizes agree, else a list of B vectors."""
        if np.all(self.sizes == self.sizes[0]):
            return v.reshape(self.systems, int(self.sizes[0]))
        return [v[a:b] for a, b in zip(self.start[:-1], self.start[1:])]

    def solve(self, b, x0=None, *, rtol=None, atol=None, maxiter=None):
        """Solve every system ``A_s x_s = b_s``.

        Parameters
        ----------
        b : array (B, n) or sequence of B vectors
        x0 : same form as ``b``, optional
            Initial guesses (default zero); never modified.
        rtol, atol, maxiter : optional
            Override the solver's defaults for this solve.

        Returns
        -------
        BatchResult
        """
        rtol = self.rtol if rtol is None else float(rtol)
        atol = self.atol if atol is None else float(atol)
        maxiter = (self.maxiter if self.maxiter is not None else 10 * int(self.sizes.max())) if maxiter is None \
            else int(maxiter)
        if maxiter < 0 or maxiter >= 2**31 - 1:
            raise InputError(f"maxiter must be in [0, 2^31), got {maxiter}")
        if not (np.isfinite(rtol) and np.isfinite(atol)) or rtol < 0 or atol < 0:
            raise InputError("rtol and atol must be finite and >= 0")
        t0 = time.perf_counter()
        xp = np if self._gpu is None else self._gpu.cupy
        bs = self._right_hand_sides(b, "b", xp)
        xs = None if x0 is None else self._right_hand_sides(x0, "x0", xp)
        solve = self._solve_cpu if self._gpu is None else self._gpu.solve
        x, status, its, rnorm, true_norms, b_norms, tol = solve(bs, xs, rtol, atol, maxiter)
        reasons = confirmed_each(status, true_norms, tol)
        return BatchResult(x=self._split(x), reasons=reasons, iterations=its,
                           residual_norms=rnorm, true_residual_norms=true_norms, b_norms=b_norms, tolerances=tol,
                           setup_time=self.setup_time, solve_time=time.perf_counter() - t0, device=self.device)

    def _solve_cpu(self, bs, xs, rtol, atol, maxiter):
        with np.errstate(over="ignore", invalid="ignore"):  # a NaN or Inf b is that system's own failure
            b_norms = np.sqrt(np.add.reduceat(bs * bs, self.start[:-1]))
        tol = np.maximum(atol, rtol * b_norms)
        x = np.zeros_like(bs) if xs is None else xs.copy()
        status = np.zeros(self.systems, dtype=np.int32)
        its = np.zeros(self.systems, dtype=np.int64)
        rnorm, true_norms = np.zeros(self.systems), np.zeros(self.systems)
        for s, A in enumerate(self.blocks):
            lo, hi = self.start[s], self.start[s + 1]
            dinv = self.inverse_diagonal[lo:hi] if self.inverse_diagonal is not None else None
            psolve = (lambda r, d=dinv: d * r) if dinv is not None else (lambda r: r.copy())
            with np.errstate(all="ignore"):  # a failing system is reported by its status, not a warning
                reason, its[s], rnorm[s] = pcg_iterate(A.dot, psolve, bs[lo:hi], x[lo:hi], tol[s], maxiter)
                true_norms[s] = np.linalg.norm(bs[lo:hi] - A @ x[lo:hi])
            status[s] = int(reason)
        return x, status, its, rnorm, true_norms, b_norms, tol


class _GPUBatch:
    """The stacked systems on the device and the on-chip kernel that solves them in one launch."""

    def __init__(self, batch):
        from ..backend import require_cupy
        from .onchip import OnChipKernel
        cupy = require_cupy()
        self.cupy = cupy
        stacked = batch.stacked()
        self.kernel = OnChipKernel(stacked.indptr, batch.start)
        i32 = lambda a: cupy.asarray(np.ascontiguousarray(a, dtype=np.int32))  # noqa: E731
        self.rowptr, self.col = i32(stacked.indptr), i32(stacked.indices)
        self.val = cupy.asarray(stacked.data)
        self.start = i32(batch.start)
        self.rows, self.systems = int(batch.start[-1]), batch.systems
        self.dinv = None if batch.inverse_diagonal is None else cupy.asarray(batch.inverse_diagonal)
        # what a launch leaves for the next one; a batch solve is one launch, so only a bound stops it there
        self.r, self.z, self.p = (cupy.empty(self.rows) for _ in range(3))
        # the States, then (||b - A x||, ||b||) of each system: one buffer, one read
        self._state_bytes = self.systems * STATE.dtype.itemsize
        self.results = cupy.zeros(self._state_bytes + 16 * self.systems, dtype=cupy.uint8)

    def describe(self):
        return self.kernel.describe()

    def solve(self, bs, xs, rtol, atol, maxiter):
        cupy = self.cupy
        x = cupy.zeros(self.rows) if xs is None else xs.copy()
        args = self.kernel.pack(rowptr=self.rowptr, col=self.col, val=self.val, dinv=self.dinv, start=self.start,
                                b=bs, x=x, r=self.r, z=self.z, p=self.p, st=self.results,
                                norms=self.results.data.ptr + self._state_bytes, rtol=rtol, atol=atol,
                                maxiter=maxiter, systems=self.systems, count=maxiter + 1, fresh=1)
        self.kernel.launch(args)
        raw = self.results.get()
        states = raw[:self._state_bytes].view(STATE.dtype)
        norms = raw[self._state_bytes:].view(np.float64).reshape(self.systems, 2)
        return (x, states["status"], states["iteration"].astype(np.int64), states["rnorm"].copy(), norms[:, 0].copy(),
                norms[:, 1].copy(), states["tol"].copy())
