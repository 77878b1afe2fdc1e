"""Smoothed-aggregation algebraic multigrid: one V-cycle per application.

The hierarchy (strength of connection, aggregation, the smoothed prolongators
``P``, restrictions ``R = P^T`` and Galerkin operators ``R A P``) is set up by
PyAMG's ``smoothed_aggregation_solver`` with its defaults, but for the size at
which coarsening stops, or on the GPU (:mod:`.amg_gpu_setup`: the same steps
with a parallel aggregation). The cycle is this module's own, the one the GPU is to
run: Jacobi or Chebyshev smoothing in ``D^{-1} A`` (:mod:`.smoothers`) on every
level, the same before and after the coarse correction (a symmetric
preconditioner), and a dense inverse of the coarsest operator (one product).
On the GPU the same cycle is a fixed sequence of kernel launches
(:meth:`AMG.device_apply`) over the levels, uploaded once where they are on the
host and used where they are when the set-up left them on the device.
"""
import numpy as np
import scipy.linalg
import scipy.sparse as sp

from ...backend import is_cupy_sparse
from ...errors import InputError
from ..cpu import VARIANTS
from .base import Preconditioner
from .chebyshev import check_degree
from .smoothers import JACOBI_OMEGA, ChebyshevSmoother, JacobiSmoother
from .spectrum import LANCZOS_STEPS

SMOOTHERS = ("chebyshev", "jacobi")
#: Where the hierarchy is set up: ``auto`` takes the GPU for a matrix on the device, PyAMG otherwise.
SETUPS = ("auto", "cpu", "gpu")
#: By default coarsening stops once a level has at most this many rows: ``COARSE_ROWS // k`` nodes for a
#: near-nullspace of ``k`` vectors (PyAMG's ``max_coarse`` counts nodes: rows, or blocks of k rows). PyAMG's
#: default, 10 nodes, suits a CPU; on the GPU every level costs about ten kernel launches (a few
#: microseconds each) whatever its size, while one product with a dense inverse of a few hundred to a few
#: thousand rows costs about one, so the hierarchy stops earlier. Counted in rows, the dense inverse stays
#: the same size whatever ``k``: 1,500 nodes of a scalar problem, 500 of 2-D elasticity with its three
#: rigid body modes (the rotated anisotropic diffusion at 2048^2 then stops at 1,276 rows, a level above
#: the 261 that 500 nodes gave: nine launches fewer a V-cycle).
COARSE_ROWS = 1500
#: The coarsest level is solved with a dense inverse: at most this many rows (128 MiB in float64).
MAX_COARSE_ROWS = 4096
#: Strength-of-connection threshold by default. PyAMG's default, 0, takes every coupling as strong,
#: so on anisotropic problems aggregates grow across the weak direction; 0.1 keeps them along the
#: strong one. Measured (CPU PCG, rtol 1e-8, the GPU set-up's hierarchy): rotated anisotropic
#: diffusion 512^2, 134 iterations with 0 and 60 with 0.1 (operator complexity 1.107 and 1.375);
#: linear elasticity 128^2, 17 and 14 (1.269 and 1.443).
THETA = 0.1


def default_coarse_size(k):
    """Nodes at which coarsening stops by default for a near-nullspace of ``k`` vectors (:data:`COARSE_ROWS`)."""
    return max(1, COARSE_ROWS // k)


def require_pyamg():
    """The pyamg module, or :class:`InputError` saying how to install it."""
    try:
        import pyamg
    except ImportError:
        raise InputError("the amg preconditioner needs PyAMG: pip install 'graphsolve-cuda[amg]'") from None
    return pyamg


def _check_count(value, name, lowest, highest=None):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lowest or (
            highest is not None and value > highest):
        span = f">= {lowest}" if highest is None else f"from {lowest} to {highest}"
        raise InputError(f"{name} must be an integer {span}, got {value!r}")
    return int(value)


def check_near_nullspace(B, n=None):
    """The near-nullspace ``B`` as a finite real ``(n, k)`` float64 array, else :class:`InputError`."""
    try:
        B = np.array(B, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError("the near-nullspace must be a real (n, k) array of numbers") from None
    if B.ndim == 1:
        B = B[:, None]
    if B.ndim != 2 or B.shape[1] < 1:
        raise InputError(f"the near-nullspace must be an (n, k) array with k >= 1, got shape {B.shape}")
    if n is not None and B.shape[0] != n:
        raise InputError(f"the near-nullspace has {B.shape[0]} rows but the matrix has {n}")
    if B.shape[1] > B.shape[0]:
        raise InputError(f"the near-nullspace has more vectors ({B.shape[1]}) than rows ({B.shape[0]})")
    if not np.all(np.isfinite(B)):
        raise InputError("the near-nullspace has NaN or Inf entries")
    if not np.linalg.norm(B, axis=0).all():
        raise InputError("the near-nullspace has a zero vector")
    return B


def _dense_inverse(A):
    """``A^+`` of the coarsest operator as a dense matrix, by Cholesky.

    With several near-nullspace vectors an aggregate smaller than their count
    leaves rows and columns of zeros in the Galerkin operator (PyAMG's ``splu``
    coarse solver drops them the same way); they are left out and their rows of
    the inverse are zero, which is the pseudo-inverse. The rest must be positive
    definite.
    """
    dense = A.toarray().astype(np.float64)
    kept = np.flatnonzero(np.abs(dense).sum(axis=1) > 0)
    inverse = np.zeros_like(dense)
    try:
        factor = scipy.linalg.cho_factor(dense[np.ix_(kept, kept)])
    except np.linalg.LinAlgError:
        raise InputError("AMG: the coarsest-level operator is not positive definite "
                         "(the matrix is not symmetric positive definite)") from None
    inverse[np.ix_(kept, kept)] = scipy.linalg.cho_solve(factor, np.eye(kept.size))
    return inverse


HIERARCHY_DTYPES = ("float64", "float32")


class _Level:
    """One level of the cycle: its operator, smoother and the transfers to the next level.

    ``A``, ``P`` and ``R`` are SciPy or cupyx CSR matrices; the smoother
    (:mod:`.smoothers`) holds its own scalars and vectors, NumPy or CuPy.
    """

    def __init__(self, A, P, R, smoother):
        self.A, self.P, self.R, self.smoother = A, P, R, smoother


class AMG(Preconditioner):
    """Smoothed-aggregation AMG (PyAMG's hierarchy), one V-cycle per application.

    Parameters
    ----------
    smoother : {"chebyshev", "jacobi"}
        Relaxation before and after the coarse correction on every level but the
        coarsest: Chebyshev of ``degree`` in ``D^{-1} A`` (default), or ``sweeps``
        steps of Jacobi weighted ``omega / rho(D^{-1} A)``.
    degree : int
        Chebyshev degree (3, PyAMG's).
    sweeps : int
        Jacobi steps before and after (1).
    omega : float
        Jacobi weight relative to the estimated ``rho(D^{-1} A)`` (4/3).
    coarse_size : int, optional
        Coarsening stops once a level has at most this many nodes (default: :data:`COARSE_ROWS`
        rows' worth, :func:`default_coarse_size`).
    max_levels : int
        At most this many levels (10, PyAMG's).
    near_nullspace : array of shape (n,) or (n, k), optional
        Vectors the tentative prolongators reproduce exactly, in the caller's numbering
        (the rigid body modes for elasticity); constants by default.
    lanczos_steps : int
        Steps of each level's eigenvalue estimate (10).
    setup : {"auto", "cpu", "gpu"}
        Where the hierarchy is built: ``cpu`` by PyAMG, ``gpu`` on the device
        (:mod:`.amg_gpu_setup`; a host matrix's levels are copied back for the CPU
        cycle), ``auto`` on the device when the matrix is there.
    theta : float
        Strength-of-connection threshold of PyAMG's ``symmetric`` measure (:data:`THETA`;
        PyAMG's default is 0).
    hierarchy_dtype : {None, "float64", "float32"}
        Precision the levels are stored and cycled in. float32 inside float64 CG halves
        the cycle's memory traffic; the outer iteration and its stopping test stay in
        float64. None: float32 for a float64 solve on the GPU, where the cycle is bound by
        that traffic (the iteration counts measured are the same), else the solver's.
    """

    name = "amg"
    variants = {"cpu": VARIANTS, "gpu": ("classic",)}

    def __init__(self, *, smoother="chebyshev", degree=3, sweeps=1, omega=JACOBI_OMEGA, coarse_size=None,
                 max_levels=10, near_nullspace=None, lanczos_steps=LANCZOS_STEPS, setup="auto", theta=THETA,
                 hierarchy_dtype=None):
        if smoother not in SMOOTHERS:
            raise InputError(f"AMG smoother must be one of {', '.join(SMOOTHERS)}, not {smoother!r}")
        self.smoother = smoother
        self.degree = check_degree(degree)
        self.sweeps = _check_count(sweeps, "AMG sweeps", 1)
        if not 0 < omega < 2:
            raise InputError(f"AMG Jacobi weight omega must lie in (0, 2), got {omega}")
        self.omega = float(omega)
        self.requested_coarse_size = None if coarse_size is None else _check_count(coarse_size, "AMG coarse size",
                                                                                   1, MAX_COARSE_ROWS)
        self.max_levels = _check_count(max_levels, "AMG max_levels", 2)
        self.lanczos_steps = _check_count(lanczos_steps, "lanczos_steps", 1)
        self.near_nullspace = None if near_nullspace is None else check_near_nullspace(near_nullspace)
        if setup not in SETUPS:
            raise InputError(f"AMG setup must be one of {', '.join(SETUPS)}, not {setup!r}")
        self.setup_device = setup
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 <= theta < 1:
            raise InputError(f"AMG strength threshold theta must lie in [0, 1), got {theta!r}")
        self.theta = float(theta)
        if hierarchy_dtype is not None and str(hierarchy_dtype) not in HIERARCHY_DTYPES:
            raise InputError(f"AMG hierarchy_dtype must be None or one of {', '.join(HIERARCHY_DTYPES)}, "
                             f"not {hierarchy_dtype!r}")
        self.hierarchy_dtype = None if hierarchy_dtype is None else np.dtype(str(hierarchy_dtype))
        self.aggregation_reused = False

    # -- set-up ---------------------------------------------------------------
    def _candidates(self, A):
        """The near-nullspace in the solver's numbering and precision, or None (PyAMG: constants)."""
        if self.near_nullspace is None:
            return None
        B = self.near_nullspace  # checked by the constructor (a pass over it costs ~60 ms at 2M rows)
        if B.shape[0] != A.shape[0]:
            raise InputError(f"the near-nullspace has {B.shape[0]} rows but the matrix has {A.shape[0]}")
        if self.reordering is not None:
            B = self.reordering.forward(B)
        return np.ascontiguousarray(B, dtype=A.dtype)

    @property
    def coarse_size(self):
        """Nodes at which coarsening stops (the one given, else the default for the near-nullspace's size)."""
        if self.requested_coarse_size is not None:
            return self.requested_coarse_size
        return default_coarse_size(1 if self.near_nullspace is None else self.near_nullspace.shape[1])

    def _setup(self, A):
        self._hierarchy(A, reuse=None)

    @staticmethod
    def _on_host(A):
        """PyAMG sets up on the host: a cupyx matrix is copied there."""
        return A.get() if is_cupy_sparse(A) else A

    def _level_dtype(self, A):
        """The precision of the levels for a solver matrix ``A`` (on the device for a GPU solve)."""
        on_device = is_cupy_sparse(A)
        dtype = self.hierarchy_dtype or (np.dtype(np.float32) if on_device else A.dtype)
        if dtype.itemsize > A.dtype.itemsize:
            raise InputError(f"AMG hierarchy_dtype {dtype} is more precise than the solver's {A.dtype}; "
                             f"take {A.dtype} or leave it unset")
        return dtype

    def update_values(self, A):
        """New values: with the same sparsity pattern the aggregation is kept and the rest recomputed.

        The prolongators, Galerkin operators, smoothers and coarse inverse are
        numeric and are rebuilt from the new values; aggregates (and the strength
        graph they came from) are kept. A new pattern sets everything up again.
        """
        fine = self.levels[0].A if self.levels else self._coarse_matrix
        # compared where the levels are; set up from A as given (a GPU solve's matrix keeps its precision rule)
        seen = A if is_cupy_sparse(fine) else self._on_host(A)
        same = (bool(self.levels) and seen.shape == fine.shape and seen.nnz == fine.nnz
                and np.array_equal(seen.indptr, fine.indptr) and np.array_equal(seen.indices, fine.indices))
        self._timed(lambda M: self._hierarchy(M, reuse=self._reusable if same else None), A)

    def _hierarchy(self, A, reuse):
        if self.setup_device == "gpu" or (self.setup_device == "auto" and is_cupy_sparse(A)):
            return self._device_hierarchy(A, reuse)
        pyamg = require_pyamg()
        dtype = self._level_dtype(A)
        A = self._on_host(A)
        options = dict(B=self._candidates(A), max_coarse=self.coarse_size, max_levels=self.max_levels,
                       strength=("symmetric", {"theta": self.theta}), presmoother=None, postsmoother=None, keep=True)
        if reuse is not None:  # PyAMG's predefined strength and aggregates, level by level
            kept = reuse.levels[:-1]
            options.update(strength=[("predefined", {"C": lvl.C}) for lvl in kept],
                           aggregate=[("predefined", {"AggOp": lvl.AggOp}) for lvl in kept],
                           max_levels=len(reuse.levels))
        # PyAMG estimates spectral radii (the prolongator smoother's weight) from np.random start
        # vectors: a fixed seed gives the same hierarchy for the same matrix, hence the same bits
        # run after run and on either device; the caller's random state is left as it was.
        saved = np.random.get_state()
        np.random.seed(0)
        try:
            ml = pyamg.smoothed_aggregation_solver(A, **options)
        except (ValueError, np.linalg.LinAlgError) as exc:
            raise InputError(f"AMG set-up failed: {exc}") from None
        finally:
            np.random.set_state(saved)
        coarsest = ml.levels[-1].A
        if coarsest.shape[0] > MAX_COARSE_ROWS:
            raise InputError(f"AMG coarsening stopped at {coarsest.shape[0]:,} rows after {len(ml.levels)} levels "
                             f"(max_levels); the coarsest level's dense inverse takes at most {MAX_COARSE_ROWS:,} "
                             "rows: raise max_levels")
        self._ml = self._reusable = ml
        self.aggregation_reused = reuse is not None
        self.built_by = f"PyAMG {pyamg.__version__}"
        self.hierarchy_method = f"{self.built_by} smoothed_aggregation_solver"
        self.storage_dtype = dtype
        self.levels = []
        for lvl in ml.levels[:-1]:
            level_A = sp.csr_matrix(lvl.A, dtype=dtype)
            P = sp.csr_matrix(lvl.P, dtype=dtype)
            self.levels.append(_Level(level_A, P, sp.csr_matrix(P.T), self._smoother(level_A)))
        self._coarse_matrix = sp.csr_matrix(coarsest, dtype=A.dtype)
        self.coarse_inverse = _dense_inverse(self._coarse_matrix).astype(dtype)

    def _device_hierarchy(self, A, reuse):
        from .amg_gpu_setup import build_on_device
        dtype = self._level_dtype(A)
        built = build_on_device(A, self._candidates(A), dtype=dtype, theta=self.theta, coarse_size=self.coarse_size,
                                max_levels=self.max_levels, lanczos_steps=self.lanczos_steps, reuse=reuse,
                                max_coarse_rows=MAX_COARSE_ROWS)
        self.storage_dtype = dtype
        self._reusable, self.aggregation_reused = built.structure, reuse is not None
        self.built_by = "GPU set-up"
        self.hierarchy_method = "set up on the GPU: MIS(2) aggregation, cuSPARSE Galerkin products"
        # each level's smoother takes the estimate of rho(D^-1 A) its prolongator was smoothed with (the
        # same Lanczos steps on the same operator, in float64): one estimate a level, not two
        self.levels = [_Level(level_A, P, R, self._smoother(level_A, rho)) for level_A, P, R, rho in
                       zip(built.operators, built.prolongators, built.restrictions, built.spectral_radii)]
        self._coarse_matrix, self.coarse_inverse = built.operators[-1], built.coarse_inverse

    def _smoother(self, A, lambda_max=None):
        """The smoother of a level with operator ``A`` (``lambda_max``: its ``rho(D^-1 A)`` when known)."""
        if self.smoother == "chebyshev":
            return ChebyshevSmoother(A, self.degree, steps=self.lanczos_steps, user="AMG smoother",
                                     lambda_max=lambda_max)
        return JacobiSmoother(A, self.omega, self.sweeps, steps=self.lanczos_steps, user="AMG smoother",
                              lambda_max=lambda_max)

    # -- the cycle ------------------------------------------------------------
    def apply(self, r):
        return self._cycle(0, r.astype(self.storage_dtype, copy=False)).astype(r.dtype, copy=False)

    def _cycle(self, k, b):
        """``x ~ A_k^{-1} b`` by one V-cycle from level ``k`` down."""
        if k == len(self.levels):
            return self.coarse_inverse @ b
        level = self.levels[k]
        x = level.smoother.from_zero(b)
        x += level.P @ self._cycle(k + 1, level.R @ (b - level.A @ x))
        level.smoother.improve(x, b)
        return x

    def device_apply(self, program):
        self._device_cycle(program, 0, program.input, program.output)

    def _device_cycle(self, program, k, b, x):
        """Append :meth:`_cycle` from level ``k`` (device vectors ``b`` in, ``x`` out) to ``program``."""
        if k == len(self.levels):
            with program.section(f"coarsest ({self.coarse_inverse.shape[0]} rows)"):
                program.axpby(program.matrix(self.coarse_inverse), b, None, x, 1.0, 0.0)
            return
        level = self.levels[k]
        rows = level.P.shape[1]
        # the residual is restricted before the coarse correction; its buffer then takes x + P e
        residual = corrected = program.scratch(level, "residual, then corrected", x.size)
        coarse_b, coarse_x = program.scratch(level, "coarse b", rows), program.scratch(level, "coarse x", rows)
        with program.section(f"level {k} pre-smoothing"):
            level.smoother.device_from_zero(program, b, x)
        with program.section(f"level {k} residual"):
            program.axpby(program.matrix(level.A), x, b, residual, -1.0, 1.0)
        with program.section(f"level {k} restriction"):
            program.axpby(program.matrix(level.R), residual, None, coarse_b, 1.0, 0.0)
        self._device_cycle(program, k + 1, coarse_b, coarse_x)
        with program.section(f"level {k} prolongation"):
            program.axpby(program.matrix(level.P), coarse_x, x, corrected, 1.0, 1.0)
        with program.section(f"level {k} post-smoothing"):
            level.smoother.device_improve(program, b, corrected, x)

    # -- reports --------------------------------------------------------------
    def level_sizes(self):
        """``(rows, nonzeros)`` of every level's operator, finest first."""
        return [(lv.A.shape[0], int(lv.A.nnz)) for lv in self.levels] + [
            (self._coarse_matrix.shape[0], int(self._coarse_matrix.nnz))]

    def operator_complexity(self):
        """Nonzeros of all levels over those of the finest (PyAMG's definition)."""
        sizes = self.level_sizes()
        return sum(nnz for _, nnz in sizes) / sizes[0][1]

    def grid_complexity(self):
        """Rows of all levels over those of the finest (PyAMG's definition)."""
        sizes = self.level_sizes()
        return sum(rows for rows, _ in sizes) / sizes[0][0]

    def _cycle_name(self):
        steps = 1 if self.smoother == "chebyshev" else self.sweeps
        what = f"chebyshev degree {self.degree}" if self.smoother == "chebyshev" else (
            f"jacobi (omega {self.omega:.4g} / rho)")
        return f"V({steps},{steps}), {what} smoothing"

    def details(self):
        return {
            "method": "smoothed aggregation", "hierarchy": self.hierarchy_method, "theta": self.theta,
            "levels": [{"rows": rows, "nonzeros": nnz} for rows, nnz in self.level_sizes()],
            "operator_complexity": self.operator_complexity(), "grid_complexity": self.grid_complexity(),
            "cycle": self._cycle_name(), "smoother": self.smoother,
            "smoothers": [lv.smoother.details() for lv in self.levels],
            "coarse_solver": "dense inverse", "coarse_size": self.coarse_size,
            "near_nullspace": "constant" if self.near_nullspace is None else (
                f"{self.near_nullspace.shape[1]} given vectors"),
            "aggregation": "reused (values updated)" if self.aggregation_reused else "new",
            "hierarchy_dtype": str(self.storage_dtype),
            "setup_time_s": self.setup_time,
        }

    def describe(self):
        sizes = self.level_sizes()
        nullspace = "constant" if self.near_nullspace is None else (
            f"{self.near_nullspace.shape[1]} given vectors")
        lines = [("amg", f"smoothed aggregation ({self.built_by}), {len(sizes)} levels, "
                         f"operator complexity {self.operator_complexity():.3f}, "
                         f"grid complexity {self.grid_complexity():.3f}"),
                 ("amg cycle", f"{self._cycle_name()}, dense inverse on the coarsest {sizes[-1][0]:,} rows, "
                               f"near-nullspace {nullspace}")]
        lines += [(f"  level {k}", f"{rows:,} rows, {nnz:,} nonzeros") for k, (rows, nnz) in enumerate(sizes)]
        return lines
