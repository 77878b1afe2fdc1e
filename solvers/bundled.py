"""Example inputs shipped inside the package, reachable from any directory.

The files live in ``solvers/data`` (in a checkout, a link to ``examples/data``),
so ``python -m solvers.pcg --example NAME`` works after a plain ``pip install``.
"""
import pathlib

from .errors import InputError

DATA_DIR = pathlib.Path(__file__).resolve().parent / "data"

EXAMPLE_MATRICES = {
    "lap2D_5pt_n100": "2D Laplacian, 5-point stencil on a 100 x 100 grid (n = 10,000, SPD)",
}


def example_matrix(name):
    """Path of the bundled Matrix Market file ``name`` (a key of ``EXAMPLE_MATRICES``).

    Raises
    ------
    InputError
        ``name`` is not a bundled matrix, or the installation lacks its file.
    """
    if name not in EXAMPLE_MATRICES:
        raise InputError(f"unknown example matrix {name!r}; bundled: {', '.join(EXAMPLE_MATRICES)}")
    path = DATA_DIR / f"{name}.mtx"
    if not path.is_file():
        raise InputError(f"the bundled file is missing from this installation ({path})")
    return path
