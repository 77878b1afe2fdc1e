"""Preconditioners for PCG, by name or as objects.

``none`` and ``jacobi`` run everywhere (CPU, GPU, distributed); ``chebyshev`` and
``amg`` run in one process, on the CPU or on the GPU (classic PCG there). A new
kind subclasses :class:`Preconditioner` (see :mod:`.base`), declares where it
runs and, to run on the GPU, gives its apply as kernel launches
(:meth:`Preconditioner.device_apply`, :mod:`.device`); :func:`refuse_unsupported`
turns the declaration into a one-line refusal.
"""
import scipy.sparse as sp
import numpy as np

from ...backend import is_cupy_sparse
from ...errors import InputError
from .amg import AMG
from .base import Identity, Jacobi, Preconditioner, jacobi_inverse_diagonal
from .chebyshev import Chebyshev

PRECONDITIONERS = {cls.name: cls for cls in (Identity, Jacobi, Chebyshev, AMG)}

__all__ = ["AMG", "Chebyshev", "Identity", "Jacobi", "Preconditioner", "PRECONDITIONERS", "as_preconditioner",
           "jacobi_inverse_diagonal", "make_preconditioner", "refuse_unsupported"]


def as_preconditioner(spec):
    """A :class:`Preconditioner` (options only) from a name or an instance, else :class:`InputError`."""
    if isinstance(spec, Preconditioner):
        return spec
    if isinstance(spec, str) and spec in PRECONDITIONERS:
        return PRECONDITIONERS[spec]()
    raise InputError(f"unknown preconditioner {spec!r}; choose from {', '.join(PRECONDITIONERS)} "
                     "or pass a solvers.pcg.Preconditioner")


def _names(where):
    """The built-in preconditioners that ``where(cls)`` admits, for messages."""
    return " or ".join(name for name, cls in PRECONDITIONERS.items() if where(cls))


def refuse_unsupported(precond, device="cpu", variant="auto", dtype="float64", distributed=False):
    """Raise :class:`InputError` with the reason when ``precond`` cannot run this way.

    Parameters
    ----------
    precond : Preconditioner
    device : {"cpu", "gpu"}
    variant : {"auto", "classic", "single-reduction"}
        ``auto`` asks only for some variant on ``device``.
    dtype : str
    distributed : bool
        A run over MPI ranks.
    """
    who = f"preconditioner {precond.name!r}"
    if distributed and not precond.distributed:
        raise InputError(f"runs in a single process only; distributed runs take {_names(lambda c: c.distributed)}",
                         who)
    variants = precond.variants.get(device, ())
    if not variants:
        if device == "gpu":
            raise InputError("has no GPU implementation yet; run it with --device cpu (device='cpu'), or take "
                             f"{_names(lambda c: 'gpu' in c.variants)} on the GPU", who)
        raise InputError(f"has no {device.upper()} implementation", who)
    if variant != "auto" and variant not in variants:
        raise InputError(f"does not run the {variant} PCG variant on the {device.upper()} "
                         f"(it takes {', '.join(variants)})", who)
    if str(np.dtype(dtype)) not in precond.dtypes:
        raise InputError(f"does not run in {np.dtype(dtype)} (it takes {', '.join(precond.dtypes)})", who)


def make_preconditioner(spec, A, reordering=None):
    """The preconditioner ``spec`` (name or object) set up on ``A`` (host, or cupyx for a GPU solve).

    ``reordering`` is the permutation the solver applied to ``A`` (see
    :meth:`Preconditioner.setup`).
    """
    precond = as_preconditioner(spec)
    on_device = is_cupy_sparse(A)
    if precond.needs_matrix and not (sp.issparse(A) or isinstance(A, np.ndarray) or on_device):
        raise InputError(f"preconditioner {precond.name!r} needs an explicit matrix, not an operator")
    return precond.setup(A, reordering)
