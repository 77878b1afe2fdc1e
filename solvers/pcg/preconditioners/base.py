"""The preconditioner plug-in interface, and the two pointwise preconditioners.

A :class:`Preconditioner` instance holds options only. :meth:`Preconditioner.setup`
returns a copy set up on the matrix the solver holds (after its reordering and
scaling); that copy gives the CPU action ``apply(r) = M^{-1} r``, takes new values
through :meth:`~Preconditioner.update_values`, and describes itself for reports.
The class attributes declare where it runs, so that a solver refuses an
unsupported combination with the reason instead of running something else.

On the GPU, the pointwise ones (none, Jacobi) are compiled into the fused PCG
kernels; any other gives its GPU apply in :meth:`Preconditioner.device_apply`,
a fixed sequence of kernel launches (:mod:`.device`) that the solver runs
inside its iteration body.
"""
import copy
import time

import numpy as np

from ...errors import InputError
from ..cpu import VARIANTS


def jacobi_inverse_diagonal(d, first_row=0, user="Jacobi preconditioner"):
    """``1 / d`` for a positive diagonal ``d`` (NumPy or CuPy), else :class:`InputError`.

    ``first_row`` is the global number of ``d[0]`` (a rank's first row), for the
    message; ``user`` names what needs the diagonal.
    """
    bad = (~(d > 0)).nonzero()[0]
    if bad.size:
        i = int(bad[0])
        raise InputError(
            f"{user} needs a positive diagonal, but {int(bad.size)} diagonal "
            f"entries are zero or negative (first: row {first_row + i + 1}, a_ii = {float(d[i]):.6g}); "
            "use --precond none or fix the matrix")
    return 1.0 / d


class Preconditioner:
    """Base of the preconditioners :class:`~solvers.pcg.PCG` takes as objects.

    Subclasses set :attr:`name`, implement :meth:`_setup` and :meth:`apply`, and
    declare their support in the class attributes below.

    Attributes
    ----------
    name : str
        What the reports call it.
    variants : dict
        Devices with an apply (``"cpu"``, ``"gpu"``), each with the PCG variants
        it runs under there.
    dtypes : tuple of str
        Precisions it can be set up in.
    distributed : bool
        Whether :class:`~solvers.distributed.DistributedPCG` can apply it over
        the ranks' rows.
    needs_matrix : bool
        Whether it is built from the matrix entries (a LinearOperator ``A`` is refused).
    pointwise : bool
        Whether the GPU PCG kernels apply it row by row themselves (none, Jacobi); if
        not, and it runs on the GPU, it implements :meth:`device_apply`.
    storage_dtype : numpy dtype or None
        Precision of what the set-up computed (the solver's unless the plug-in stores
        less); None before set-up.
    setup_time : float or None
        Seconds the last set-up (or :meth:`update_values`) took; None before set-up.
    """

    name = None
    variants = {"cpu": VARIANTS}
    dtypes = ("float64", "float32")
    distributed = False
    needs_matrix = True
    pointwise = False
    storage_dtype = None
    setup_time = None
    reordering = None

    def setup(self, A, reordering=None):
        """A copy of this preconditioner set up on ``A`` (this object keeps its options only).

        Parameters
        ----------
        A : scipy.sparse.csr_matrix or cupyx.scipy.sparse.csr_matrix
            The matrix the solver iterates with, in its working precision (on the
            device for a GPU solve; a plug-in that sets up on the host copies it there).
        reordering : solvers.reorder.Reordering, optional
            The symmetric permutation the solver applied to the caller's matrix;
            data given in the caller's numbering (a near-nullspace) is permuted with it.
        """
        bound = copy.copy(self)
        bound.reordering = reordering
        bound.storage_dtype = A.dtype
        bound._timed(bound._setup, A)
        return bound

    def update_values(self, A):
        """Take new values of the matrix (same size); by default, set up again."""
        self._timed(self._setup, A)

    def _timed(self, step, A):
        t0 = time.perf_counter()
        step(A)
        self.setup_time = time.perf_counter() - t0

    def _setup(self, A):
        raise NotImplementedError

    def apply(self, r):
        """``M^{-1} r`` as a new array."""
        raise NotImplementedError

    def device_apply(self, program):
        """Append the launches computing ``program.output = M^{-1} program.input`` to ``program``.

        ``program`` is a :class:`~.device.DeviceProgram` in :attr:`storage_dtype`;
        the launches run on the GPU, in the order appended, inside the solver's
        iteration body, so they do the same operations as :meth:`apply`.
        """
        raise NotImplementedError

    def details(self):
        """What the set-up chose and found, as JSON-ready values (for the JSON report)."""
        return {}

    def describe(self):
        """Lines of ``(label, text)`` for the human-readable report (none by default)."""
        return []


class Identity(Preconditioner):
    """No preconditioning (``M = I``)."""

    name = "none"
    variants = {"cpu": VARIANTS, "gpu": VARIANTS}
    distributed = True
    needs_matrix = False
    pointwise = True
    inverse_diagonal = None

    def _setup(self, A):
        pass

    def apply(self, r):
        return r.copy()


class Jacobi(Preconditioner):
    """Diagonal (Jacobi) preconditioning, ``M = diag(A)``; the diagonal must be positive.

    On the GPU the fused PCG kernels apply it (from the inverse diagonal, computed
    there on the device), under every variant; distributed runs apply it on each
    rank's rows.
    """

    name = "jacobi"
    variants = {"cpu": VARIANTS, "gpu": VARIANTS}
    distributed = True
    pointwise = True

    def _setup(self, A):
        d = np.asarray(A.diagonal())
        self.inverse_diagonal = jacobi_inverse_diagonal(d).astype(d.dtype)

    def apply(self, r):
        return self.inverse_diagonal * r
