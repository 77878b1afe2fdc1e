"""The reusable PCG solver object: set up once, solve many right-hand sides."""
import time

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from ..backend import is_device_array, require_cupy, resolve_device
from ..errors import DeviceError, InputError
from ..reorder import choose_reordering
from .cpu import CPUPCG, resolve_variant
from .preconditioners import make_preconditioner
from .result import SolveResult

DTYPES = ("float64", "float32")


class _OperatorPreconditioner:
    """Wrap a user's ``M`` (LinearOperator, matrix or callable) as ``M^{-1}`` action on the CPU."""

    name = "user"
    inverse_diagonal = None

    def __init__(self, M):
        self._apply = spla.aslinearoperator(M).matvec

    def apply(self, r):
        return self._apply(r)


def _is_cupy_sparse(A):
    mod = type(A).__module__
    return mod.startswith("cupyx.scipy.sparse")


def _host_matrix(A, dtype):
    """Normalise a host matrix: CSR for sparse or dense input, LinearOperator kept as is."""
    if isinstance(A, spla.LinearOperator):
        return A
    if sp.issparse(A):
        A = sp.csr_matrix(A, dtype=dtype)
    else:
        A = np.asarray(A)
        if A.ndim != 2:
            raise InputError(f"A must be 2-D, got shape {A.shape}")
        if not np.issubdtype(A.dtype, np.number) or np.iscomplexobj(A):
            raise InputError(f"A must be real, got dtype {A.dtype}")
        A = sp.csr_matrix(A.astype(dtype))
    if not np.all(np.isfinite(A.data)):
        raise InputError("A has NaN or Inf entries")
    return A


class PCG:
    """Preconditioned conjugate gradients for symmetric positive definite ``A``.

    Sets up once (matrix upload, preconditioner, kernels and the captured
    graph on the GPU), then :meth:`solve` runs any number of right-hand sides.

    Parameters
    ----------
    A : sparse matrix, ndarray, LinearOperator, CuPy / cupyx array or any DLPack / CUDA array
        The system matrix. Device arrays select the GPU without a host round trip.
    preconditioner : {"jacobi", "none"}
        Built-in preconditioner; ignored when ``M`` is given.
    M : LinearOperator or matrix, optional
        User preconditioner (action of ``M^{-1}``), CPU only.
    rtol, atol : float
        Default stopping rule ``||r|| <= max(atol, rtol * ||b||)``.
    maxiter : int, optional
        Default iteration limit (``10 * n``).
    device : {"auto", "cpu", "gpu"}
    mode : {"auto", "eager", "graph", "while"}
        GPU driver; the CPU accepts ``auto`` and ``eager`` only.
    dtype : {"float64", "float32"}
    unroll : int
        Iterations per kernel launch on the GPU, hence per graph launch
        (``graph``) or per WHILE pass (``while``).
    record_history : bool
        Keep the residual norm of every iteration in the result.
    variant : {"auto", "classic", "single-reduction"}
        Classic PCG, or the Chronopoulos-Gear form: the same iterates in exact
        arithmetic with one grid-wide reduction per iteration instead of two,
        which on the GPU halves the grid-wide barriers. ``auto`` takes
        single-reduction on the GPU for small systems (latency bound), classic
        otherwise; the ``variant`` attribute says which ran.
    matrix_format : {"auto", "ell", "sell", "csr"}
        Storage of A on the GPU (:mod:`solvers.formats`): ``auto`` takes ELL for
        rows of nearly equal length (stencils), else SELL; ``format`` says which.
    reorder : {"auto", "none", "rcm"}
        Symmetric reordering applied at set-up (reverse Cuthill-McKee), hidden
        from the caller: ``b``, ``x0`` and ``x`` stay in the original numbering.
        ``auto`` decides from how scattered the product's reads are
        (:func:`solvers.reorder.choose_reordering`); ``reordering`` says what was
        done and why, ``reorder_time`` what it cost.
    """

    def __init__(self, A, *, preconditioner="jacobi", M=None, rtol=1e-5, atol=0.0, maxiter=None,
                 device="auto", mode="auto", dtype="float64", unroll=32, record_history=False,
                 variant="auto", matrix_format="auto", reorder="auto"):
        t0 = time.perf_counter()
        if str(np.dtype(dtype)) not in DTYPES:
            raise InputError(f"dtype must be float64 or float32, not {dtype}")
        self.dtype = np.dtype(dtype)
        self.rtol, self.atol, self.maxiter = float(rtol), float(atol), maxiter
        self.record_history = record_history
        self.device, self.device_note = self._choose_device(A, M, device, mode)
        self._order, self.reordering = self._choose_reordering(A, reorder)
        if self._order is not None:
            A = self._order.matrix(self._where_solved(A))
        self.reorder_time = self._order.seconds if self._order is not None else 0.0
        if self.device == "cpu":
            if matrix_format != "auto":
                raise InputError(f"matrix format {matrix_format!r} is a GPU storage; "
                                 "the CPU solver takes 'auto'")
            if mode not in ("auto", "eager"):
                raise DeviceError(f"mode {mode!r} runs CUDA graphs and needs a GPU; use --mode eager or auto on the CPU")
            A = _host_matrix(A, self.dtype)
            self.shape = A.shape
            variant = resolve_variant(variant, A.shape[0], "cpu")
            precond = _OperatorPreconditioner(M) if M is not None else make_preconditioner(preconditioner, A)
            self._impl = CPUPCG(A, precond, self.dtype, variant)
        else:
            from .gpu import GPUPCG
            self._impl = GPUPCG(A, preconditioner, self.dtype, mode, unroll, record_history, variant,
                                matrix_format)
            self.shape = self._impl.shape
            variant = self._impl.variant
        if self.shape[0] != self.shape[1]:
            raise InputError(f"A must be square, got shape {self.shape}")
        self.preconditioner = "user" if M is not None else preconditioner
        self.variant = variant
        self.format = self._impl.describe() if self.device == "gpu" else None
        self.setup_time = time.perf_counter() - t0

    def _where_solved(self, A):
        """A sparse matrix on the device the solve runs on (a reordering permutes it there)."""
        if self.device == "gpu" and not _is_cupy_sparse(A):
            import cupyx.scipy.sparse as csp
            return csp.csr_matrix(sp.csr_matrix(A))
        return A.get() if _is_cupy_sparse(A) and self.device == "cpu" else A

    def _choose_reordering(self, A, reorder):
        """``(Reordering or None, note)``; a matrix already on the GPU is reordered only on request."""
        if reorder == "auto" and (_is_cupy_sparse(A) or is_device_array(A)):
            return None, "none (the matrix is on the GPU)"
        return choose_reordering(A.get() if _is_cupy_sparse(A) else A, reorder, self.device)

    @staticmethod
    def _choose_device(A, M, device, mode):
        on_device = is_device_array(A) or _is_cupy_sparse(A)
        host_only = isinstance(A, spla.LinearOperator) or M is not None
        if host_only and device == "gpu":
            raise DeviceError("the GPU path needs an explicit matrix and a built-in preconditioner "
                              "(LinearOperator A or M runs on the CPU)")
        if on_device:
            if device == "cpu":
                raise DeviceError("A is a GPU array; pass a host matrix for device='cpu'")
            require_cupy()
            return "gpu", None
        if host_only:
            return "cpu", None
        if mode not in ("auto", "eager") and device != "cpu":
            try:
                return resolve_device("gpu")
            except DeviceError as exc:
                raise DeviceError(f"mode {mode!r} runs CUDA graphs and needs a GPU ({exc})") from None
        return resolve_device(device)

    @property
    def mode(self):
        return self._impl.mode

    @property
    def instantiations(self):
        """Executable graphs built so far (0 on the CPU and in eager mode)."""
        return getattr(self._impl, "instantiations", 0)

    def update_values(self, A):
        """Replace the matrix values, keeping the sparsity pattern when it is unchanged.

        On the GPU the new values are copied in place and the captured graph
        is reused; a different pattern sets the solver up again.
        """
        if self.device == "cpu":
            A = _host_matrix(A, self.dtype)
            if A.shape != self.shape:
                raise InputError(f"new matrix has shape {A.shape}, expected {self.shape}")
            self._impl.update_values(A)
            if self.preconditioner != "user":
                self._impl.M = make_preconditioner(self.preconditioner, A)
        else:
            self._impl.update_values(A)

    def solve(self, b, x0=None, *, rtol=None, atol=None, maxiter=None, callback=None, progress=None):
        """Solve ``A x = b``.

        Parameters
        ----------
        b : array
            Right-hand side (host or device array).
        x0 : array, optional
            Initial guess; never modified.
        rtol, atol, maxiter : optional
            Override the solver's defaults for this solve.
        callback : callable, optional
            ``callback(xk)`` after every iteration (on the GPU this runs the
            eager driver, one host synchronisation per iteration).
        progress : callable, optional
            ``progress(iteration, rnorm)`` for a live display; on the GPU it is
            fed from host-mapped memory while the graph runs, never pausing it.

        Returns
        -------
        SolveResult
        """
        n = self.shape[0]
        rtol = self.rtol if rtol is None else float(rtol)
        atol = self.atol if atol is None else float(atol)
        maxiter = (self.maxiter if self.maxiter is not None else 10 * n) if maxiter is None else int(maxiter)
        if maxiter < 0:
            raise InputError(f"maxiter must be >= 0, got {maxiter}")
        if rtol < 0 or atol < 0:
            raise InputError("rtol and atol must be >= 0")
        t0 = time.perf_counter()
        b = self._impl.check_vector(b, "b")
        if x0 is not None:
            x0 = self._impl.check_vector(x0, "x0")
        order = self._order
        if order is not None:
            b = order.forward(b)
            x0 = None if x0 is None else order.forward(x0)
            if callback is not None:
                user_callback = callback
                callback = lambda xk: user_callback(order.backward(xk))  # noqa: E731
        b_norm = self._impl.norm(b)
        tol = max(atol, rtol * b_norm)
        x, reason, its, rnorm, history = self._impl.solve(b, x0, tol, maxiter, callback, self.record_history,
                                                          progress)
        true_rnorm = self._impl.true_residual_norm(b, x)
        if order is not None:
            x = order.backward(x)
        return SolveResult(x=x, reason=reason, iterations=int(its), residual_norm=float(rnorm),
                           true_residual_norm=true_rnorm, b_norm=b_norm, tolerance=tol,
                           setup_time=self.setup_time, solve_time=time.perf_counter() - t0,
                           loop_time=self._impl.last_loop_time, device=self.device, mode=self._impl.mode,
                           mode_note=self._impl.mode_note or self.device_note, history=history)
