"""The reusable PCG solver object: set up once, solve many right-hand sides.

What every device shares lives here, above the CPU and GPU implementations:
input checks (real, finite, square), the memory check before allocating, the
power-of-two scaling of badly scaled systems (:mod:`.scaling`) and the check
of a converged result against its true residual.
"""
import math
import time

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from ..backend import is_cupy_sparse, is_device_array, require_cupy, resolve_device
from ..errors import DeviceError, InputError
from ..reorder import canonical, choose_reordering
from ..resources import require_device_memory, require_host_memory
from . import scaling
from .batched import BatchResult
from .cpu import CPUPCG, resolve_variant
from .preconditioners import Preconditioner, as_preconditioner, make_preconditioner, refuse_unsupported
from .result import Reason, SolveResult, confirmed, confirmed_each

DTYPES = ("float64", "float32")
#: ``reordering`` where the GPU solver's SELL layout numbers the rows (``GPUPCG.numbering``).
FORMAT_NUMBERING = "the format's own: rows numbered as SELL lays them out (no cost beyond its set-up)"
# Vectors a solve holds besides the matrix: x, b, r, z, p, q and the true residual on the CPU;
# single-reduction's extra pairs and the history on the GPU stay below this count.
_WORK_VECTORS = 12


class _OperatorPreconditioner(Preconditioner):
    """Wrap a user's ``M`` (LinearOperator, matrix or callable) as ``M^{-1}`` action on the CPU.

    ``shift`` is the power of two ``A`` was scaled by: the action is scaled by
    its inverse, so that ``M`` stays an approximation of the scaled matrix.
    """

    name = "user"
    inverse_diagonal = None

    def __init__(self, M, shift=0):
        self._apply = spla.aslinearoperator(M).matvec
        self.shift = shift

    def apply(self, r):
        z = self._apply(r)
        return np.ldexp(z, -self.shift) if self.shift else z


def _is_complex(obj):
    """True for complex arrays, matrices and operators (lists and scalars included)."""
    dtype = getattr(obj, "dtype", None)
    if dtype is None and not isinstance(obj, spla.LinearOperator) and not callable(obj):
        try:
            dtype = np.asarray(obj).dtype
        except (TypeError, ValueError):
            return False
    if dtype is None:
        return False
    try:
        return np.dtype(dtype).kind == "c"
    except TypeError:  # another library's dtype object (torch.float64, ...)
        return bool(getattr(dtype, "is_complex", False)) or "complex" in str(dtype)


def refuse_complex(obj, name):
    """Raise :class:`InputError` for complex input: CG here solves real systems only."""
    if _is_complex(obj):
        raise InputError(f"{name} must be real, got dtype {getattr(obj, 'dtype', 'complex')} "
                         "(complex systems are not supported)")


def _entries(A):
    """Stored entries of a matrix (its size when dense; 0 for an operator)."""
    if isinstance(A, spla.LinearOperator):
        return 0
    nnz = getattr(A, "nnz", None)
    return int(nnz) if nnz is not None else int(np.prod(getattr(A, "shape", (0,))))


def host_bytes(n, nnz, dtype, copies_matrix=True):
    """Host memory a CPU solve of ``n`` rows and ``nnz`` entries takes, matrix copy included."""
    itemsize = np.dtype(dtype).itemsize
    return _WORK_VECTORS * n * itemsize + (nnz * (itemsize + 4) + 8 * (n + 1) if copies_matrix else 0)


def device_bytes(n, nnz, dtype):
    """GPU memory a solve takes at least: the matrix (values and 32-bit column indices) and the vectors."""
    itemsize = np.dtype(dtype).itemsize
    return nnz * (itemsize + 4) + 4 * (n + 1) + _WORK_VECTORS * n * itemsize


def _as_array(v):
    """A host or device vector as an array whose entries can be scaled."""
    if is_device_array(v):
        return scaling._device_array(v)
    return np.asarray(v)


def _host_matrix(A, dtype):
    """Normalise a host matrix: CSR for sparse or dense input, LinearOperator kept as is."""
    if isinstance(A, spla.LinearOperator):
        return A
    if sp.issparse(A):
        given = A.data
        A = sp.csr_matrix(A, dtype=dtype)
    else:
        A = np.asarray(A)
        if A.ndim != 2:
            raise InputError(f"A must be 2-D, got shape {A.shape}")
        if not np.issubdtype(A.dtype, np.number) or np.iscomplexobj(A):
            raise InputError(f"A must be real, got dtype {A.dtype}")
        given = A
        A = sp.csr_matrix(A.astype(dtype))
    if not np.all(np.isfinite(A.data)):
        raise InputError("A has NaN or Inf entries")
    if np.dtype(given.dtype).itemsize > np.dtype(dtype).itemsize:
        flushed = np.count_nonzero(given) - np.count_nonzero(A.data)
        if flushed:
            raise InputError(f"{flushed} nonzero entries of A are too small to be held in {np.dtype(dtype)} next "
                             f"to its largest ones (they would become 0); use float64")
    return A


class PCG:
    """Preconditioned conjugate gradients for symmetric positive definite ``A``.

    Sets up once (matrix upload, preconditioner, kernels and the captured
    graph on the GPU), then :meth:`solve` runs any number of right-hand sides.

    Parameters
    ----------
    A : sparse matrix, ndarray, LinearOperator, CuPy / cupyx array or any DLPack / CUDA array
        The system matrix. Device arrays select the GPU without a host round trip.
    preconditioner : {"jacobi", "none", "chebyshev", "amg"} or Preconditioner
        A built-in preconditioner by name (default options), or an object with
        its options (:class:`~solvers.pcg.Chebyshev`, :class:`~solvers.pcg.AMG`,
        ...), set up here on the matrix; ignored when ``M`` is given.
        On the GPU, ``chebyshev`` and ``amg`` run under classic PCG (``variant``
        ``auto`` takes it for them); a plug-in without a GPU apply makes
        ``device="auto"`` take the CPU (the ``device_note`` says why).
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
    unroll : int, optional
        Iterations per kernel launch on the GPU, hence per graph launch
        (``graph``) or per WHILE pass (``while``); by default 32 on the grid
        path and the whole solve on the on-chip path (whose launches cost a
        larger share of its short iterations).
    record_history : bool
        Keep the residual norm of every iteration in the result.
    variant : {"auto", "classic", "single-reduction"}
        Classic PCG, or the Chronopoulos-Gear form: the same iterates in exact
        arithmetic with one grid-wide reduction per iteration instead of two,
        which on the GPU halves the grid-wide barriers. ``auto`` takes
        single-reduction on the GPU's grid path for small systems (latency
        bound), classic otherwise and on the on-chip path; the ``variant``
        attribute says which ran.
    matrix_format : {"auto", "dia", "ell", "sell", "csr"}
        Storage of A on the GPU (:mod:`solvers.formats`): ``auto`` takes DIA for
        a stencil on a grid numbered in order, ELL for other rows of nearly equal
        length, else SELL; ``format`` says which.
    reorder : {"auto", "none", "rcm", "neighbours"}
        Symmetric reordering, hidden from the caller: ``b``, ``x0`` and ``x`` stay in
        the original numbering. ``rcm`` reorders at set-up by reverse Cuthill-McKee
        (computed on the GPU for a GPU solve, by SciPy for a CPU one);
        ``neighbours`` by SELL's neighbours' order (rows sharing a neighbour
        together: a few sorts, a third of RCM's time on the 2M-row random geometric
        graph, and an iteration 184 us there against RCM's 209; see
        :func:`solvers.reorder.choose_reordering`). ``auto``, on the GPU's grid path
        with Jacobi or no preconditioner: where SELL lays the rows out by neighbours,
        or by length over a scattered numbering (:class:`solvers.formats.SELL`), the
        solver numbers its rows as they are laid out, at no cost beyond the format's
        set-up; otherwise it
        plans the neighbours' renumbering where the
        product's reads are scattered (:func:`solvers.reorder.auto_reordering`), and
        reorders once the solves have run as many iterations as numbered as it takes
        to pay for itself (:class:`solvers.reorder.DeferredReordering`): in the solve
        it falls due in, if that solve is predicted to run as long again (it goes on
        from its iterate, CG restarted in the new numbering), else at the start of
        the next solve. Solves of
        k right-hand sides and :meth:`enqueue` run in the numbering of the moment and
        do not count; :meth:`enqueue` gives the plan up. ``reordering`` says what was
        planned or done and why, ``reorder_time`` what it cost.
    path : {"auto", "grid", "on-chip"}
        GPU kernel: ``grid``, the persistent kernel over the whole GPU (grid-wide
        barriers), or ``on-chip``, the whole iteration inside one thread block or
        one cluster (:mod:`solvers.pcg.onchip`; either variant, up to 131,072 rows).
        ``auto`` takes on-chip for small systems (:func:`solvers.pcg.onchip.choose_path`);
        ``path`` says which ran and ``path_note`` why.
    """

    def __init__(self, A, *, preconditioner="jacobi", M=None, rtol=1e-5, atol=0.0, maxiter=None,
                 device="auto", mode="auto", dtype="float64", unroll=None, record_history=False,
                 variant="auto", matrix_format="auto", reorder="auto", path="auto"):
        t0 = time.perf_counter()
        try:
            dtype_name = str(np.dtype(dtype))
        except TypeError:
            dtype_name = str(dtype)
        if dtype_name not in DTYPES:
            raise InputError(f"dtype must be float64 or float32, not {dtype}")
        self.dtype = np.dtype(dtype)
        self.rtol, self.atol, self.maxiter = check_tolerances(rtol, atol, maxiter)
        refuse_complex(A, "A")
        if M is not None:
            refuse_complex(M, "M")
        self.record_history = record_history
        self._requested_variant, self._requested_unroll = variant, unroll
        self._column_solvers = {}  # GPU: the solver of each number of right-hand sides, set up on first use
        spec = None if M is not None else as_preconditioner(preconditioner)
        wants_gpu = device == "gpu" or (device == "auto" and mode not in ("auto", "eager"))
        if spec is not None and wants_gpu:  # the reason, before looking for a GPU
            refuse_unsupported(spec, "gpu", variant, self.dtype)
        self.device, self.device_note = self._choose_device(A, M, spec, device, mode)
        given_on_device = is_cupy_sparse(A) or is_device_array(A)
        A = self._uploaded(A)
        # auto on the GPU plans once the solver is set up: its format may number the rows its own way
        plan_later = reorder == "auto" and self.device == "gpu" and not given_on_device
        self._order, self.reordering = (None, None) if plan_later else self._choose_reordering(A, reorder,
                                                                                               given_on_device)
        self._plan = None  # a DeferredReordering not yet due
        unscaled = A
        if self._order is not None:
            A = self._order.matrix(self._where_solved(A))
        self.reorder_time = self._order.seconds if self._order is not None else 0.0
        self._a_shift = self._shift_for(A)
        A = scaling.scaled(A, self._a_shift)
        n, nnz = (getattr(A, "shape", None) or (0, 0))[0], _entries(A)
        self.path, self.path_note = "cpu", None
        if self.device == "cpu":
            if path != "auto":
                raise InputError(f"{path!r} is a GPU kernel; the CPU solver takes 'auto'", "--path")
            if matrix_format != "auto":
                raise InputError(f"{matrix_format!r} is a GPU storage; the CPU solver takes 'auto'", "--format")
            if mode not in ("auto", "eager"):
                raise DeviceError(f"mode {mode!r} runs CUDA graphs and needs a GPU; "
                                  "use --mode eager or auto on the CPU")
            copies = not (sp.isspmatrix_csr(A) and A.dtype == self.dtype)
            require_host_memory(host_bytes(n, nnz, self.dtype, copies), f"a PCG solve of {n:,} rows")
            A = _host_matrix(A, self.dtype)
            self.shape = A.shape
            variant = resolve_variant(variant, A.shape[0], "cpu")
            if M is None:
                refuse_unsupported(spec, "cpu", variant, self.dtype)
                precond = make_preconditioner(spec, A, self._order)
                dtype = self.dtype  # the closure takes values, not self: a cycle would outlive `del`
                self._rebuild = lambda A, order: CPUPCG(A, make_preconditioner(spec, A, order), dtype, variant)
            else:
                precond = _OperatorPreconditioner(M, self._a_shift)
            self._impl = CPUPCG(A, precond, self.dtype, variant)
        else:
            from .gpu import GPUPCG
            from .onchip import ClustersUnavailable, OnChipPCG, choose_path
            refuse_unsupported(spec, "gpu", variant, self.dtype)
            require_device_memory(device_bytes(n, nnz, self.dtype), f"a PCG solve of {n:,} rows")
            self.path, self.path_note = choose_path(path, n, variant, spec.name, A, np.dtype(self.dtype).itemsize)
            if self.path == "on-chip":  # the pointwise preconditioners only (choose_path refuses the others)
                try:
                    self._impl = OnChipPCG(A, spec.name, self.dtype, mode, OnChipPCG.default_unroll
                                           if unroll is None else unroll, record_history, variant, matrix_format)
                except ClustersUnavailable as exc:
                    if path != "auto":
                        raise
                    self.path, self.path_note = "grid", f"auto: {exc}; the whole GPU"
            if self.path == "grid":  # any preconditioner that runs on the GPU
                unroll = GPUPCG.default_unroll if unroll is None else unroll
                renumber = reorder == "auto"  # SELL's layout by neighbours may number the rows its way
                self._impl = GPUPCG(A, spec, self.dtype, mode, unroll, record_history, variant, matrix_format,
                                    reordering=self._order, renumber=renumber)
                dtype, chosen = self.dtype, self._impl.variant  # values, not self: a cycle would outlive `del`
                self._rebuild = lambda A, order: GPUPCG(A, spec, dtype, mode, unroll, record_history, chosen,
                                                        matrix_format, reordering=order, renumber=renumber)
                self._note_numbering()
            if plan_later:
                self._plan_reordering(unscaled, self.path == "grid" and not self._impl.split, n, nnz)
            self.shape = self._impl.shape
            variant = self._impl.variant
        if self.shape[0] != self.shape[1]:
            raise InputError(f"A must be square, got shape {self.shape}")
        self.preconditioner = "user" if M is not None else spec.name
        self.variant = variant
        self.format = self._impl.describe() if self.device == "gpu" else None
        self.setup_time = time.perf_counter() - t0

    def _where_solved(self, A):
        """A sparse matrix on the device the solve runs on (a reordering permutes it there)."""
        if self.device == "gpu" and not is_cupy_sparse(A):
            import cupyx.scipy.sparse as csp
            return csp.csr_matrix(sp.csr_matrix(A))
        return A.get() if is_cupy_sparse(A) and self.device == "cpu" else A

    def _uploaded(self, A):
        """A host sparse matrix copied to the GPU once for a GPU solve, else ``A`` as given: the set-up's
        measurements (reordering, scaling, checks) then read it there instead of on the host."""
        return self._where_solved(A) if self.device == "gpu" and sp.issparse(A) else A

    def _choose_reordering(self, A, reorder, given_on_device):
        """``(Reordering or None, note)``; a matrix the caller gave on the GPU is reordered only on request."""
        if reorder == "auto" and given_on_device:
            return None, "none (the matrix is on the GPU)"
        return choose_reordering(A, reorder, self.device)

    def _note_numbering(self):
        """Where the GPU solver's format numbers the rows as it lays them out, say so in ``reordering`` and give
        up a deferred reordering: the layout's numbering already takes the place of one."""
        if getattr(self._impl, "numbering", None) is not None:
            self._plan, self.reordering = None, FORMAT_NUMBERING
        elif self.reordering == FORMAT_NUMBERING:  # a new pattern's layout keeps the given numbering
            self.reordering = "none"

    def _plan_reordering(self, A, fused_grid, n, nnz):
        """``reorder="auto"`` on the GPU, once the solver is set up with ``A`` as given: nothing more where the
        format numbers the rows its own way (:meth:`_note_numbering`), else the plan of
        :func:`~solvers.reorder.choose_reordering`, kept where the solver can carry it out.

        Its cost model is the fused grid kernel's (the on-chip path and a preconditioner's own launches gain
        differently), and it keeps ``A`` on the GPU until it is due. The reads are measured only where a plan
        could be kept (4.4 ms of a 14 ms set-up of the geometric 50k graph on an H200, MEASUREMENTS.md).
        """
        if self.reordering == FORMAT_NUMBERING:
            return
        if not fused_grid and (sp.issparse(A) or is_cupy_sparse(A)):
            self.reordering = ("none (auto reorders the grid path with Jacobi or no preconditioner; "
                               "reorder='rcm' asks for it)")
            return
        self._plan, self.reordering = choose_reordering(A, "auto", self.device)
        if self._plan is not None:
            try:
                require_device_memory(2 * device_bytes(n, nnz, self.dtype), "A kept for a later reordering")
            except DeviceError:
                self._plan, self.reordering = None, "none (no room on the GPU to keep A for a later reordering)"

    def _reorder_now(self, *vectors):
        """Carry out the deferred reordering; ``vectors`` (device, as numbered) in the numbering that follows.

        Where the ordering disappoints (:meth:`DeferredReordering.order`), or the
        reordered solver does not fit beside the current one, the plan is dropped and
        the numbering kept.
        """
        plan, self._plan = self._plan, None
        order, self.reordering = plan.order()
        if order is None:
            return vectors
        try:
            self._impl = self._rebuild(scaling.scaled(order.matrix(plan.A), self._a_shift), order)
        except MemoryError:  # CuPy's out-of-memory error is one; the solver as numbered is intact
            self.reordering = "none (no room on the GPU for the reordered matrix when the reordering fell due)"
            return vectors
        self._order = order
        self.reorder_time = order.seconds
        self.format = self._impl.describe() if self.device == "gpu" else None
        self._column_solvers.clear()
        return tuple(None if v is None else order.forward(v) for v in vectors)

    def _iterate(self, bv, x0, tol, maxiter, callback, progress):
        """The implementation's solve, through a deferred reordering that falls due within ``maxiter``.

        Returns ``(bv, (x, reason, iterations, rnorm, history), loop_time, capture_time)``
        with ``bv`` and ``x`` in the numbering the solve ended in. A reordering due
        mid-solve stops the iteration there; it goes on from its iterate, in the new
        numbering where the rest of the solve is predicted to pay for the reordering
        (:meth:`DeferredReordering.pays_within`), else as numbered with the
        reordering left due for the next solve; either way CG restarts.
        """
        if self._plan is not None and self._plan.left == 0:
            bv, x0 = self._reorder_now(bv, x0)
        plan = self._plan
        cap = maxiter if plan is None else min(maxiter, plan.left)
        outcome = self._impl.solve(bv, x0, tol, cap, callback, self.record_history, progress)
        loop, capture = self._impl.last_loop_time, getattr(self._impl, "last_capture_time", 0.0)
        if plan is None:
            return bv, outcome, loop, capture
        x, reason, its, rnorm, history = outcome
        plan.ran(its)
        if reason is not Reason.MAX_ITERATIONS or its == maxiter:
            return bv, outcome, loop, capture
        initial = self._impl.norm(bv) if x0 is None else self._impl.true_residual_norm(bv, x0)
        if plan.pays_within(initial, rnorm, its, tol):
            bv, x = self._reorder_now(bv, x)
        if progress is not None:
            given_progress = progress

            def progress(iteration, rnorm):
                given_progress(its + iteration, rnorm)
        x, reason, more, rnorm, rest = self._impl.solve(bv, x, tol, maxiter - its, callback, self.record_history,
                                                        progress)
        if history is not None:
            history = np.concatenate([history, rest[1:]])
        loop += self._impl.last_loop_time
        capture += getattr(self._impl, "last_capture_time", 0.0)
        return bv, (x, reason, its + more, rnorm, history), loop, capture

    def _shift_for(self, A):
        """The power of two that brings ``A``'s entries into the working precision's safe band."""
        largest = scaling.largest_entry(A)
        return 0 if largest is None else scaling.shift_for(largest, self.dtype)

    @property
    def _set_up_preconditioner(self):
        """The set-up preconditioner object: the CPU's, or the GPU's when it is not pointwise; else None."""
        return getattr(self._impl, "M", None)  # the fused kernels apply none and Jacobi themselves

    @property
    def preconditioner_details(self):
        """What the preconditioner's set-up chose and found (levels, bounds, ...), for reports.

        {} for the pointwise ones on the GPU, which the fused kernels apply.
        """
        M = self._set_up_preconditioner
        return M.details() if M is not None else {}

    @property
    def preconditioner_lines(self):
        """``(label, text)`` lines describing the preconditioner for the human-readable report."""
        M = self._set_up_preconditioner
        return M.describe() if M is not None else []

    @property
    def preconditioner_setup_time(self):
        """Seconds the preconditioner's last set-up took (part of ``setup_time``); None when it has none."""
        M = self._set_up_preconditioner
        return M.setup_time if M is not None else None

    @staticmethod
    def _choose_device(A, M, spec, device, mode):
        on_device = is_device_array(A) or is_cupy_sparse(A)
        host_only = isinstance(A, spla.LinearOperator) or M is not None
        if spec is not None and "gpu" not in spec.variants:
            if device == "gpu" or on_device or (mode not in ("auto", "eager") and device != "cpu"):
                refuse_unsupported(spec, "gpu")
            if device == "auto":
                choice, note = resolve_device("auto")
                return "cpu", (note if choice == "cpu" else
                               f"auto: preconditioner {spec.name!r} runs on the CPU only so far")
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
        is reused; a different pattern sets the solver up again. On the CPU the
        preconditioner takes the new values (``Preconditioner.update_values``:
        AMG keeps its aggregation when the pattern is unchanged).
        """
        refuse_complex(A, "A")
        A = self._uploaded(A)
        if self._order is not None:  # the solver holds the reordered matrix
            A = self._order.matrix(self._where_solved(A))
        given = A  # a deferred reordering permutes and scales it when due
        shift = self._shift_for(A)
        A = scaling.scaled(A, shift)
        if self.device == "cpu":
            A = _host_matrix(A, self.dtype)
            if A.shape != self.shape:
                raise InputError(f"new matrix has shape {A.shape}, expected {self.shape}")
            self._impl.update_values(A)
            if self.preconditioner != "user":
                self._impl.M.update_values(A)
            else:
                self._impl.M.shift = shift
        else:
            self._impl.update_values(A)
            self._column_solvers.clear()  # they copied the old values
            self._note_numbering()
        if self._plan is not None:
            if sp.issparse(given) or is_cupy_sparse(given):
                self._plan.A = canonical(self._where_solved(given))
            else:
                self._plan, self.reordering = None, "none (the new values came as a dense matrix)"
        self._a_shift = shift

    def solve(self, b, x0=None, *, rtol=None, atol=None, maxiter=None, callback=None, progress=None):
        """Solve ``A x = b``.

        Parameters
        ----------
        b : array
            Right-hand side (host or device array), or k of them as the columns of an
            ``(n, k)`` array (:meth:`solve` then returns a :class:`BatchResult`, one entry a column;
            an ``(n, 1)`` array is one right-hand side, as in SciPy).
        x0 : array, optional
            Initial guess (``(n, k)`` with k right-hand sides); never modified.
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
        SolveResult, or BatchResult for k right-hand sides
            With k right-hand sides every column is solved as if alone, with its own
            stop reason, iteration count and true residual: a column stops updating
            once it has stopped, and one that breaks down or turns NaN is reported
            alone. On the GPU the k columns run at once, classic PCG with Jacobi or
            no preconditioner (each matrix entry read once an iteration for all of
            them; :mod:`solvers.pcg.multirhs`); on the CPU one after the other.
        """
        n = self.shape[0]
        rtol, atol, maxiter = check_tolerances(self.rtol if rtol is None else rtol,
                                               self.atol if atol is None else atol,
                                               self.maxiter if maxiter is None else maxiter)
        maxiter = 10 * n if maxiter is None else maxiter
        refuse_complex(b, "b")
        if x0 is not None:
            refuse_complex(x0, "x0")
        columns = _columns(b)
        if columns is not None:
            if callback is not None or progress is not None:
                raise InputError("callback and progress follow one right-hand side; solve the columns one at a "
                                 "time to watch them")
            if self.record_history:
                raise InputError("record_history keeps the residuals of one right-hand side; set the solver up "
                                 "without it to solve k right-hand sides")
            solve_columns = self._solve_columns_gpu if self.device == "gpu" else self._solve_columns_cpu
            return solve_columns(b, x0, columns, rtol, atol, maxiter)
        t0 = time.perf_counter()
        with np.errstate(over="ignore", under="ignore"):  # a b out of range is scaled just below
            bv = self._impl.check_vector(b, "b")
            b_norm = self._impl.norm(bv)
        b_shift = scaling.rhs_shift(b_norm, self.dtype, lambda: scaling.largest_entry(b))
        if b_shift:
            bv = self._impl.check_vector(scaling.scaled(_as_array(b), b_shift), "b")
            b_norm = self._impl.norm(bv)
        x_shift = b_shift - self._a_shift  # the scaled system's solution is x * 2**x_shift
        if x0 is not None:
            x0 = self._impl.check_vector(scaling.scaled(_as_array(x0), x_shift) if x_shift else x0, "x0")
        if self._order is not None:
            bv = self._order.forward(bv)
            x0 = None if x0 is None else self._order.forward(x0)
        tol = max(math.ldexp(atol, b_shift), rtol * b_norm)
        if callback is not None and (self._order is not None or self._plan is not None or x_shift):
            user_callback = callback

            def callback(xk):  # the caller's numbering (which a deferred reordering may change) and scale
                order = self._order
                user_callback(scaling.scaled(xk if order is None else order.backward(xk), -x_shift))
        if b_shift and progress is not None:
            user_progress = progress

            def progress(iteration, rnorm):
                user_progress(iteration, math.ldexp(rnorm, -b_shift))
        bv, (x, reason, its, rnorm, history), loop_time, capture_time = self._iterate(bv, x0, tol, maxiter, callback,
                                                                                     progress)
        true_rnorm = self._impl.true_residual_norm(bv, x)
        reason = confirmed(reason, true_rnorm, tol)
        if self._order is not None:
            x = self._order.backward(x)
        if b_shift or x_shift:
            history, (rnorm, true_rnorm, b_norm, tol) = scaling.restore(x, history, (rnorm, true_rnorm, b_norm, tol),
                                                                        b_shift, x_shift)
        return SolveResult(x=x, reason=reason, iterations=int(its), residual_norm=float(rnorm),
                           true_residual_norm=true_rnorm, b_norm=b_norm, tolerance=tol,
                           setup_time=self.setup_time, solve_time=time.perf_counter() - t0,
                           loop_time=loop_time, capture_time=capture_time,
                           device=self.device, mode=self._impl.mode,
                           mode_note=self._impl.mode_note or self.device_note, history=history)

    def _solve_columns_cpu(self, b, x0, columns, rtol, atol, maxiter):
        """k right-hand sides on the CPU: each column solved by :meth:`solve`, one after the other."""
        t0 = time.perf_counter()
        blocks = []
        for name, v in (("b", b), ("x0", x0)):
            if v is not None and is_device_array(v):
                raise DeviceError(f"{name} is a GPU array but the solver runs on the CPU")
            if v is not None and np.shape(v) != (self.shape[0], columns):
                raise InputError(f"{name} has shape {np.shape(v)}, expected ({self.shape[0]}, {columns})")
            blocks.append(None if v is None else np.asarray(v))
        b, x0 = blocks
        results = [self.solve(b[:, j], None if x0 is None else x0[:, j], rtol=rtol, atol=atol, maxiter=maxiter)
                   for j in range(columns)]
        each = lambda name: np.array([getattr(r, name) for r in results])  # noqa: E731
        return BatchResult(x=np.column_stack([r.x for r in results]), reasons=[r.reason for r in results],
                           iterations=each("iterations"), residual_norms=each("residual_norm"),
                           true_residual_norms=each("true_residual_norm"), b_norms=each("b_norm"),
                           tolerances=each("tolerance"), setup_time=self.setup_time,
                           solve_time=time.perf_counter() - t0, device="cpu", mode=self._impl.mode,
                           loop_time=float(sum(r.loop_time for r in results)))

    def _solve_columns_gpu(self, b, x0, columns, rtol, atol, maxiter):
        """k right-hand sides on the GPU, all at once (:class:`~.multirhs.GPUMultiRHS`)."""
        from .gpu import GPUPCG
        from .multirhs import GPUMultiRHS, refuse_columns
        impl = self._impl
        if impl.split:
            raise InputError(f"k right-hand sides run on the GPU with Jacobi or no preconditioner, not "
                             f"{self.preconditioner!r} (solve the columns one at a time)")
        if self._requested_variant == "single-reduction":
            raise InputError("k right-hand sides run classic PCG on the GPU, not 'single-reduction'")
        refuse_columns(columns)
        t0 = time.perf_counter()
        cupy = impl.cupy
        given = _as_array(b)
        with np.errstate(over="ignore", under="ignore"):
            bv = impl.check_vector(b, "b", columns)
        b_norms = cupy.linalg.norm(bv, axis=0).get()
        b_shift = np.array([scaling.rhs_shift(float(b_norms[j]), self.dtype,
                                              lambda j=j: scaling.largest_entry(given[:, j]))
                            for j in range(columns)], dtype=np.int32)
        if b_shift.any():
            bv = impl.check_vector(scaling.scaled_columns(given, b_shift), "b", columns)
            b_norms = cupy.linalg.norm(bv, axis=0).get()
        x_shift = b_shift - self._a_shift  # the scaled system's solutions are x[:, j] * 2**x_shift[j]
        if x0 is not None:
            x0 = impl.check_vector(scaling.scaled_columns(_as_array(x0), x_shift), "x0", columns)
        order = self._order
        if order is not None:
            bv = order.forward(bv)
            x0 = None if x0 is None else order.forward(x0)
        tol = np.fmax(np.ldexp(atol, b_shift), rtol * b_norms)  # fmax: a NaN column keeps atol (it stops as NaN)
        solver = self._column_solvers.get(columns)
        if solver is None:
            solver = GPUMultiRHS(impl, columns, impl.mode, self._requested_unroll or GPUPCG.default_unroll)
            self._column_solvers[columns] = solver
        x, states, true_norms, loop_time, capture_time = solver.solve(bv, x0, tol, maxiter)
        reasons = confirmed_each(states["status"], true_norms, tol)
        if order is not None:
            x = order.backward(x)
        x = scaling.scaled_columns(x, -x_shift)
        unscale = lambda v: np.ldexp(np.asarray(v, dtype=np.float64), -b_shift)  # noqa: E731
        return BatchResult(x=x, reasons=reasons, iterations=states["iteration"].astype(np.int64),
                           residual_norms=unscale(states["rnorm"]), true_residual_norms=unscale(true_norms),
                           b_norms=unscale(b_norms), tolerances=unscale(tol), setup_time=self.setup_time,
                           solve_time=time.perf_counter() - t0, device="gpu", mode=solver.mode,
                           loop_time=loop_time)

    def enqueue(self, b, out, x0=None, *, rtol=None, atol=None, maxiter=None):
        """Enqueue a whole solve of ``A x = b`` on the current CuPy stream, into ``out``.

        Everything happens on the device: the norm of ``b`` and the tolerance,
        the iteration (run to its stop in one launch of the path's kernel) and the
        copy of x into ``out``; nothing is allocated, nothing waits for or reads
        from the host. A caller can therefore capture it into its own graph
        (``stream.begin_capture()`` ... ``end_capture()``) with the work around it,
        and replay that graph; the arrays' addresses are what the graph keeps.
        :meth:`enqueued_result` reads the outcome of the last solve afterwards.

        Parameters
        ----------
        b, out : cupy.ndarray
            Device vectors of ``n`` entries in the solver's dtype (``out`` may be ``x0``).
        x0 : cupy.ndarray, optional
            Initial guess (default zero).
        rtol, atol, maxiter : optional
            As for :meth:`solve`.
        """
        if self.device != "gpu":
            raise DeviceError("enqueue runs a solve on the GPU; this solver runs on the CPU")
        if self._order is not None or self._a_shift:
            raise InputError("enqueue needs a solver without reordering or scaling of A "
                             "(set it up with reorder='none'; A's entries are outside the safe range)")
        if self.record_history:
            raise InputError("enqueue does not record a history (set the solver up without record_history)")
        if self._set_up_preconditioner is not None:  # on the GPU: its own kernels around PCG's, not one kernel
            raise InputError(f"enqueue runs the solve as one kernel, which applies Jacobi or no preconditioner; "
                             f"preconditioner {self.preconditioner!r} runs in a graph of kernels: use solve")
        cupy = require_cupy()
        for name, v in (("b", b), ("out", out), ("x0", x0)):
            if v is None and name == "x0":
                continue
            if not isinstance(v, cupy.ndarray) or v.shape != (self.shape[0],) or v.dtype != self.dtype \
                    or not v.flags.c_contiguous:
                raise InputError(f"{name} must be a contiguous CuPy vector of shape ({self.shape[0]},) and dtype "
                                 f"{self.dtype}")
        stream = cupy.cuda.get_current_stream()
        capture = _capture_status(stream)
        if capture == "invalidated":
            raise DeviceError("the current stream's capture has been invalidated; nothing was enqueued")
        if capture == "implicit" or (capture == "active" and stream.ptr == 0):
            raise DeviceError("the legacy default stream cannot be captured; capture on a stream of your own "
                              "(with cupy.cuda.Stream(non_blocking=True): ...)")
        rtol, atol, maxiter = check_tolerances(self.rtol if rtol is None else rtol,
                                               self.atol if atol is None else atol,
                                               self.maxiter if maxiter is None else maxiter)
        maxiter = 10 * self.shape[0] if maxiter is None else maxiter
        if maxiter >= 2**31 - 1:
            raise InputError("maxiter must be below 2^31")
        if self._plan is not None:  # a caller's graph may keep these buffers: they must stay the solver's
            self._plan, self.reordering = None, "none (auto's deferred reordering given up: the solver was enqueued)"
        self._impl.enqueue(b, out, x0, rtol, atol, maxiter)

    def enqueued_result(self):
        """``(reason, iterations, residual_norm, tolerance)`` of the last solve :meth:`enqueue` made.

        Reads the device state: call it after the stream (or the replayed graph) has finished.
        """
        return self._impl.enqueued_result()



def _columns(b):
    """k when ``b`` holds k > 1 right-hand sides as the columns of an ``(n, k)`` array, else None."""
    shape = getattr(b, "shape", None)
    if shape is None:
        try:
            shape = np.shape(b)
        except (TypeError, ValueError):
            return None
    return int(shape[1]) if len(shape) == 2 and shape[0] > 1 and shape[1] > 1 else None


def _capture_status(stream):
    """The stream's capture status name ("none", "active", "invalidated")."""
    cupy = require_cupy()
    try:
        status = cupy.cuda.runtime.streamIsCapturing(stream.ptr)
    except cupy.cuda.runtime.CUDARuntimeError:  # the legacy stream while another one captures
        return "implicit"
    return {cupy.cuda.runtime.streamCaptureStatusNone: "none",
            cupy.cuda.runtime.streamCaptureStatusActive: "active"}.get(status, "invalidated")


def check_tolerances(rtol, atol, maxiter):
    """``(rtol, atol, maxiter)`` checked: finite, non-negative tolerances; an integer limit >= 0 or None."""
    values = []
    for name, value in (("rtol", rtol), ("atol", atol)):
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise InputError(f"{name} must be a number, got {value!r}") from None
        if not (math.isfinite(value) and value >= 0):
            raise InputError(f"{name} must be finite and >= 0, got {value}")
        values.append(value)
    if maxiter is not None:
        if isinstance(maxiter, (float, np.floating)) and not float(maxiter).is_integer():
            raise InputError(f"maxiter must be an integer, got {maxiter}")
        try:
            maxiter = int(maxiter)
        except (TypeError, ValueError, OverflowError):
            raise InputError(f"maxiter must be an integer, got {maxiter!r}") from None
        if maxiter < 0:
            raise InputError(f"maxiter must be >= 0, got {maxiter}")
    return values[0], values[1], maxiter
