"""Settings and strategies shared by the property tests (hypothesis).

:func:`spd_matrices` draws symmetric positive definite matrices with the row-length profiles the
formats meet: diagonal-only rows, short rows numbered near the diagonal (a mesh) or anywhere (a
scattered numbering), and up to three hub rows whose lengths sit on either side of SELL's long-row
bound and of its pieces' length, numbered first or anywhere. Each is a weighted graph Laplacian plus
a positive shift: symmetric, diagonally dominant, with a positive diagonal, so Jacobi PCG converges.
"""
import numpy as np
import scipy.sparse as sp
from hypothesis import HealthCheck, settings, strategies as st

from solvers.formats import SELL

# Off-diagonal entries of a hub row: its length (one more, the diagonal) just under, at and over
# SELL.LONG_ROW and SELL.PIECE_LENGTH, and a row of three pieces.
HUB_ENTRIES = (SELL.LONG_ROW - 2, SELL.LONG_ROW - 1, SELL.LONG_ROW, SELL.PIECE_LENGTH - 1, SELL.PIECE_LENGTH,
               2 * SELL.PIECE_LENGTH + 3)
MEAN_DEGREES = (0.0, 0.5, 2.0, 6.0, 14.0, 30.0)


def fuzz(examples):
    """Hypothesis settings of a repeatable property test of ``examples`` examples."""
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])


def laplacian_plus_shift(n, rows, cols, unit_weights, shift, rng):
    """``D - W + shift I`` for the symmetric weights ``W`` on the edges ``(rows, cols)`` (both ways),
    ``D`` their row sums: unit weights give off-diagonal entries of exactly -1."""
    keep = rows != cols
    rows, cols = rows[keep], cols[keep]
    weights = np.ones(rows.size) if unit_weights else rng.uniform(0.1, 1.0, rows.size)
    W = sp.coo_matrix((weights, (rows, cols)), shape=(n, n)).tocsr()
    W = W + W.T
    if unit_weights:
        W.data[:] = 1.0  # an edge drawn twice is still one unit coupling
    degree = np.asarray(W.sum(axis=1)).ravel()
    A = sp.diags(degree + shift) - W
    A = sp.csr_matrix(A)
    A.sum_duplicates()
    A.sort_indices()
    return A


@st.composite
def spd_matrices(draw, max_n=1200):
    """A random SPD ``scipy.sparse.csr_matrix`` (canonical: sorted indices, no duplicates)."""
    n = draw(st.integers(1, max_n))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    hubs = [h for h in draw(st.lists(st.sampled_from(HUB_ENTRIES), max_size=3)) if h < n - 3]
    regular = np.arange(len(hubs), n)  # the hubs are rows 0 .. len(hubs) - 1 until numbered anew
    mean = draw(st.sampled_from(MEAN_DEGREES))
    band = draw(st.sampled_from((None, 3, 40)))  # neighbours within a band, or anywhere
    counts = rng.poisson(mean / 2, regular.size)  # each edge is drawn from one end
    rows = np.repeat(regular, counts)
    if band is None:
        cols = rng.choice(regular, rows.size) if regular.size else rows
    else:
        cols = np.clip(rows + rng.integers(-band, band + 1, rows.size), len(hubs), n - 1)
    hub_rows = [np.full(h, i) for i, h in enumerate(hubs)]
    hub_cols = [rng.choice(regular, h, replace=False) for h in hubs]  # exactly h entries off the diagonal
    rows, cols = np.concatenate([rows, *hub_rows]).astype(np.int64), np.concatenate([cols, *hub_cols]).astype(np.int64)
    A = laplacian_plus_shift(n, rows, cols, draw(st.booleans()), draw(st.sampled_from((1e-2, 1.0))), rng)
    if draw(st.booleans()):  # numbered anew: the hubs anywhere, a band scattered
        order = rng.permutation(n)
        A = sp.csr_matrix(A[order][:, order])
        A.sort_indices()
    return A
