"""The distributed PCG solver object (one per rank, same calls on every rank)."""
import dataclasses
import math
import time

import numpy as np

from ..errors import InputError
from ..pcg.preconditioners import as_preconditioner, jacobi_inverse_diagonal, refuse_unsupported
from ..pcg import scaling
from ..pcg.result import SolveResult, confirmed
from ..pcg.cpu import VARIANTS
from ..pcg.solver import DTYPES, check_tolerances, refuse_complex
from .comm import agree
from .partition import split_rows


# Rows per rank from which the classic variant is the faster one. On two H200s (3D Poisson, us per
# iteration, scripts/probe_dist_latency.py at 9af8dc5, two runs): single-reduction won at 131k rows
# per rank (28.5, 27.2 against 32.1, 36.4) and 256k (36.2, 38.9 against 42.7, 39.9), tied at 500k
# (63.3, 62.3 against 68.4, 57.0); classic won at 1M (78.7 against 97.5) and 2M (124 against 170):
# single-reduction's fused step gathers r, s, w and the diagonal at every neighbour, which costs
# more than its one NCCL step saves once the vectors leave the L2 cache.
CLASSIC_MIN_ROWS_PER_RANK = 500_000


def auto_variant(n, ranks):
    """The PCG variant ``variant="auto"`` runs for ``n`` rows over ``ranks`` ranks."""
    return "classic" if n >= CLASSIC_MIN_ROWS_PER_RANK * ranks else "single-reduction"


def _host(v):
    """A NumPy view or copy of a host or CuPy vector."""
    return np.asarray(v.get() if hasattr(v, "get") else v)


@dataclasses.dataclass
class DistSolveResult(SolveResult):
    """:class:`~solvers.pcg.result.SolveResult` of a distributed solve.

    ``x`` holds this rank's rows only (:meth:`DistributedPCG.gather` collects
    it). ``communication_time`` is the part of ``loop_time`` spent in (on the
    GPU: waiting for) halo exchanges and allreduces; ``compute_time`` the rest.
    """

    ranks: int = 1
    variant: str = "classic"
    compute_time: float = 0.0
    communication_time: float = 0.0


class DistributedPCG:
    """Preconditioned CG over MPI ranks, each owning a block of rows.

    Every rank constructs it with its own rows and calls :meth:`solve` with
    its own entries of ``b``; all ranks take the same decisions from the same
    reduced values, so they stop at the same iteration.

    Parameters
    ----------
    rows : scipy.sparse.csr_matrix
        This rank's rows ``bounds[rank]:bounds[rank+1]`` with global column indices.
    bounds : ndarray
        Row bounds of every rank (``len = ranks + 1``).
    comm : mpi4py communicator, optional
        ``MPI.COMM_WORLD`` by default.
    preconditioner : {"jacobi", "none"} or Preconditioner
        One that declares itself distributed (``chebyshev`` and ``amg`` are refused).
    rtol, atol, maxiter, dtype, record_history
        As for :class:`solvers.pcg.PCG`.
    device : {"auto", "cpu", "gpu"}
        ``auto`` runs on the GPUs when every rank has one.
    variant : {"auto", "classic", "single-reduction"}
        ``single-reduction`` (Chronopoulos-Gear) does one allreduce per
        iteration instead of two; ``auto`` picks by rows per rank
        (:func:`auto_variant`).
    check_every : int
        GPU only: iterations enqueued between two host reads of the status.
    """

    def __init__(self, rows, bounds, comm=None, *, preconditioner="jacobi", rtol=1e-5, atol=0.0,
                 maxiter=None, device="auto", variant="auto", dtype="float64",
                 record_history=False, check_every=16):
        t0 = time.perf_counter()
        if comm is None:
            from .comm import world
            comm = world()
        self.comm = comm
        self.ranks = comm.Get_size()
        self.bounds = np.asarray(bounds, dtype=np.int64)
        self.shape = (int(self.bounds[-1]), int(self.bounds[-1]))
        self.rtol, self.atol, self.maxiter = float(rtol), float(atol), maxiter
        self.record_history = record_history
        self.variant = variant = auto_variant(self.shape[0], self.ranks) if variant == "auto" else variant
        self.dtype = np.dtype(dtype)
        self.device_name = None

        def check_options():
            refuse_complex(rows, "this rank's rows")
            if variant not in VARIANTS:
                raise InputError(f"variant must be one of {', '.join(VARIANTS)}, not {variant!r}")
            if str(self.dtype) not in DTYPES:
                raise InputError(f"dtype must be float64 or float32, not {dtype}")
            refuse_unsupported(as_preconditioner(preconditioner), distributed=True)
            if len(self.bounds) != self.ranks + 1:
                raise InputError(f"bounds has {len(self.bounds)} entries for {self.ranks} ranks")
            lo, hi = self.bounds[comm.Get_rank()], self.bounds[comm.Get_rank() + 1]
            if rows.shape != (hi - lo, self.shape[0]):
                raise InputError(f"this rank's rows have shape {rows.shape}, expected {(hi - lo, self.shape[0])}")
            if check_every < 1:
                raise InputError("check_every must be >= 1")

        agree(comm, check_options)
        self.preconditioner = as_preconditioner(preconditioner).name
        self.device, self.device_note = agree(comm, self._choose_device, device)
        self._a_shift = scaling.shift_for(self._largest(rows), self.dtype)  # see solvers.pcg.scaling
        self.matrix = split_rows(scaling.scaled(rows, self._a_shift).astype(self.dtype), self.bounds, comm)
        inverse_diagonal = agree(comm, self._inverse_diagonal)
        if self.device == "cpu":
            from .cpu import DistCPUPCG
            self._impl = DistCPUPCG(self.matrix, inverse_diagonal, comm, variant, self.dtype)
        else:
            from .gpu import DistGPUPCG
            self._impl = DistGPUPCG(self.matrix, inverse_diagonal, comm, variant, self.dtype, check_every)
            self.device_name = self._impl.device_name
        self.setup_time = time.perf_counter() - t0

    def _choose_device(self, device):
        from ..backend import resolve_device
        if device not in ("auto", "cpu", "gpu"):
            raise InputError(f"device must be auto, cpu or gpu, not {device!r}")
        choice, note = resolve_device(device)
        # auto must pick the same device on every rank.
        if self.comm.allreduce(choice == "cpu") and choice == "gpu":
            return "cpu", "auto: some ranks have no GPU, running on the CPU"
        return choice, note

    def _largest(self, local):
        """The largest entry over every rank's ``local`` array or matrix (collective)."""
        from mpi4py import MPI
        return self.comm.allreduce(scaling.largest_entry(local), op=MPI.MAX)

    def _inverse_diagonal(self):
        if self.preconditioner == "none":
            return None
        return jacobi_inverse_diagonal(self.matrix.diagonal(), self.matrix.lo).astype(self.dtype)

    @property
    def mode(self):
        return self._impl.mode

    def _check_vector(self, v, name):
        refuse_complex(v, name)
        v = _host(v)
        if v.ndim == 2 and 1 in v.shape:
            v = v.reshape(-1)
        if v.shape != (self.matrix.rows,):
            raise InputError(f"{name} has shape {v.shape} on this rank, expected ({self.matrix.rows},)")
        if np.iscomplexobj(v) or not np.issubdtype(v.dtype, np.number):
            raise InputError(f"{name} must be real, got dtype {v.dtype}")
        return v.astype(self.dtype, copy=False)

    def solve(self, b, x0=None, *, rtol=None, atol=None, maxiter=None):
        """Solve ``A x = b`` (collective).

        Parameters
        ----------
        b : array
            This rank's entries of the right-hand side.
        x0 : array, optional
            This rank's entries of the initial guess; never modified.
        rtol, atol, maxiter : optional
            Override the solver's defaults for this solve.

        Returns
        -------
        DistSolveResult
            ``x`` is this rank's part of the solution (a CuPy array on the GPU).
        """
        n = self.shape[0]

        def check():
            tolerances = check_tolerances(self.rtol if rtol is None else rtol, self.atol if atol is None else atol,
                                          self.maxiter if maxiter is None else maxiter)
            return tolerances, self._check_vector(b, "b"), None if x0 is None else self._check_vector(x0, "x0")

        (rtol, atol, maxiter), bv, x0v = agree(self.comm, check)
        maxiter = 10 * n if maxiter is None else maxiter
        t0 = time.perf_counter()
        with np.errstate(over="ignore", under="ignore"):  # a b out of range is scaled just below
            b_norm = self._impl.norm(bv)
        b_shift = scaling.rhs_shift(b_norm, self.dtype, lambda: self._largest(_host(b)))  # same on every rank
        if b_shift:
            bv = self._check_vector(scaling.scaled(_host(b), b_shift), "b")
            b_norm = self._impl.norm(bv)
        x_shift = b_shift - self._a_shift  # the scaled system's solution is x * 2**x_shift
        if x_shift and x0v is not None:
            x0v = self._check_vector(scaling.scaled(_host(x0), x_shift), "x0")
        tol = max(math.ldexp(atol, b_shift), rtol * b_norm)
        # counted from here, so the communication is that of the loop_time the impl measures
        comm_before = self._impl.communication_time
        x, reason, its, rnorm, history = self._impl.solve(bv, x0v, tol, maxiter, self.record_history)
        communication = self._impl.communication_time - comm_before
        true_rnorm = self._impl.true_residual_norm(bv, x)
        reason = confirmed(reason, true_rnorm, tol)
        if b_shift or x_shift:
            history, (rnorm, true_rnorm, b_norm, tol) = scaling.restore(x, history, (rnorm, true_rnorm, b_norm, tol),
                                                                        b_shift, x_shift)
        solve_time = time.perf_counter() - t0
        loop_time = self._impl.loop_time
        return DistSolveResult(
            x=x, reason=reason, iterations=int(its), residual_norm=float(rnorm),
            true_residual_norm=true_rnorm, b_norm=b_norm, tolerance=tol, setup_time=self.setup_time,
            solve_time=solve_time, loop_time=loop_time, device=self.device, mode=self.mode,
            mode_note=self.device_note, history=history, ranks=self.ranks, variant=self.variant,
            compute_time=loop_time - communication, communication_time=communication)

    def gather(self, x, root=0):
        """The whole solution on ``root`` (None elsewhere); for output only. Collective."""
        x = np.ascontiguousarray(x.get() if hasattr(x, "get") else x)
        counts = np.diff(self.bounds)
        out = np.empty(self.shape[0], dtype=x.dtype) if self.comm.Get_rank() == root else None
        self.comm.Gatherv(x, [out, counts] if out is not None else None, root=root)
        return out
