"""NumPy meaning of the kernels in ``precond.cu`` and ``precond_pointwise.cu`` (used by the tests).

``M`` is a SciPy CSR matrix; vectors are NumPy arrays, updated in place where the
kernel writes them.
"""


def axpby(M, v, y, a, c):
    """a M v + c y (y None: a M v)."""
    return a * (M @ v) + (c * y if y is not None else 0)


def chebyshev_begin(b, dinv, first, x):
    """rs = D^-1 b, d = first rs, x = d; returns (d, rs)."""
    rs = dinv * b
    d = first * rs
    x[:] = d
    return d, rs


def chebyshev_residual(A, x, b, dinv, first, x_out=None):
    """rs = D^-1 (b - A x), d = first rs (and x_out = x + d when given); returns (d, rs)."""
    rs = dinv * (b - A @ x)
    d = first * rs
    if x_out is not None:
        x_out[:] = x + d
    return d, rs


def chebyshev_start_step(A, b, dinv, first, x_out, c1, c2):
    """chebyshev_begin's d_0 = first D^-1 b (rs = D^-1 b, x = d_0), then one chebyshev_step from it, in one
    pass (d_0 not stored): rs -= D^-1 A d_0, d_new = c1 d_0 + c2 rs, x_out = d_0 + d_new; returns (d_new, rs)."""
    rs = dinv * b
    d0 = first * rs
    rs = rs - dinv * (A @ d0)
    d_new = c1 * d0 + c2 * rs
    x_out[:] = d0 + d_new
    return d_new, rs


def chebyshev_step(A, dinv, d_old, rs, x_in, x_out, c1, c2, add_old):
    """rs -= D^-1 A d_old, d_new = c1 d_old + c2 rs, x_out = x_in (+ d_old) + d_new; returns d_new.

    Also ``chebyshev_step_to_outer``, whose ``x_out`` is in the solver's precision (the same values, converted)."""
    rs -= dinv * (A @ d_old)
    d_new = c1 * d_old + c2 * rs
    x_out[:] = (x_in + d_old if add_old else x_in) + d_new
    return d_new


def jacobi_sweep(A, y, b, s):
    """y + s (b - A y)."""
    return y + s * (b - A @ y)


def scaled_add(s, v, x, accumulate):
    """x = s v, or x += s v with accumulate."""
    if accumulate:
        x += s * v
    else:
        x[:] = s * v
