"""NumPy meaning of the kernels in ``precond.cu`` (used by the GPU tests).

``M`` is a SciPy CSR matrix; vectors are NumPy arrays, updated in place where the
kernel writes them.
"""


def csr_axpby(M, v, y, a, c):
    """a M v + c y (y None: a M v)."""
    return a * (M @ v) + (c * y if y is not None else 0)


def chebyshev_begin(b, dinv, first, x, accumulate):
    """rs = D^-1 b, d = first rs, x = d (x += d with accumulate); returns (d, rs)."""
    rs = dinv * b
    d = first * rs
    if accumulate:
        x += d
    else:
        x[:] = d
    return d, rs


def chebyshev_step(A, dinv, d_old, rs, x, c1, c2):
    """rs -= D^-1 A d_old, d_new = c1 d_old + c2 rs, x += d_new; returns d_new."""
    rs -= dinv * (A @ d_old)
    d_new = c1 * d_old + c2 * rs
    x += d_new
    return d_new


def scaled_add(s, v, x, accumulate):
    """x = s v, or x += s v with accumulate."""
    if accumulate:
        x += s * v
    else:
        x[:] = s * v
