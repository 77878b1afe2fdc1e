"""The kernel storage layout (ELL or CSR) reproduces the matrix, on NumPy."""
import numpy as np
import scipy.sparse as sp

from solvers.gallery import poisson
from solvers.pcg.layout import MatrixLayout, subwarp


def as_arrays(A):
    return A.indptr.astype(np.int32), A.indices.astype(np.int32)


def test_stencil_becomes_ell_and_reproduces_the_product():
    A = poisson((7, 9, 5))
    layout = MatrixLayout(*as_arrays(A))
    assert layout.format == "ell" and dict(layout.defines)["ELL_WIDTH"] == "7" and layout.lanes == 1
    n, width = A.shape[0], 7
    val = layout.values(A.data)
    x = np.random.default_rng(0).standard_normal(n)
    y = sum(val[k * n:(k + 1) * n] * x[layout.col[k * n:(k + 1) * n]] for k in range(width))
    np.testing.assert_allclose(y, A @ x, rtol=1e-14, atol=1e-14)
    pad = val == 0
    rows = np.tile(np.arange(n), width)
    assert np.array_equal(layout.col[pad], rows[pad])  # padding points at its own row


def test_irregular_rows_stay_csr():
    rng = np.random.default_rng(1)
    A = sp.random(200, 200, density=0.02, random_state=rng, format="csr") + sp.diags(np.full(200, 5.0))
    A = sp.csr_matrix(A + A.T)
    A[0, :] = 1.0  # one dense row: ELL would pad every row to it
    A = sp.csr_matrix(A)
    layout = MatrixLayout(*as_arrays(A))
    assert layout.format == "csr" and layout.lanes == subwarp(A.nnz, 200)
    np.testing.assert_array_equal(layout.values(A.data), A.data)


def test_subwarp_follows_mean_row_length():
    assert subwarp(7 * 100, 100) == 8 and subwarp(3 * 100, 100) == 4 and subwarp(100, 100) == 2
    assert subwarp(1000 * 10, 10) == 32
