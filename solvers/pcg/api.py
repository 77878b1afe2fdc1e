"""SciPy-compatible entry point over :class:`~solvers.pcg.solver.PCG`."""
from ..backend import is_cupy_sparse, is_device_array
from .solver import PCG


def cg(A, b, x0=None, *, rtol=1e-5, atol=0.0, maxiter=None, M=None, callback=None,
       preconditioner="none", device=None, mode="auto", variant="auto"):
    """Solve ``A x = b`` by (preconditioned) conjugate gradients, like ``scipy.sparse.linalg.cg``.

    Parameters
    ----------
    A : sparse matrix, ndarray, LinearOperator or GPU array
    b : array
        One right-hand side, or k as the columns of an ``(n, k)`` array.
    x0 : array, optional
        Initial guess (default zeros), of ``b``'s shape; never modified.
    rtol, atol : float
        Stop when ``||r|| <= max(atol, rtol * ||b||)``.
    maxiter : int, optional
        Iteration limit, ``10 * n`` by default.
    M : LinearOperator or matrix, optional
        Preconditioner (action of ``M^{-1}``), as in SciPy.
    callback : callable, optional
        ``callback(xk)`` after each iteration.
    preconditioner : {"none", "jacobi", "chebyshev", "amg"} or Preconditioner
        Built-in preconditioner when ``M`` is None (SciPy's default is none); see
        :class:`~solvers.pcg.PCG`.
    device : {None, "auto", "cpu", "gpu"}
        None follows the inputs: GPU arrays solve on the GPU, host arrays on the CPU.
    mode : {"auto", "eager", "graph", "while"}
        GPU driver.
    variant : {"auto", "classic", "single-reduction"}
        PCG form (see :class:`~solvers.pcg.solver.PCG`).

    Returns
    -------
    x : array
        Same kind of array as ``b`` (NumPy or CuPy), of its shape.
    info : int, or ndarray of k ints for k right-hand sides
        0 converged; > 0 iterations done without converging; < 0 breakdown
        (-1: not positive definite, -2: NaN or Inf).
    """
    if device is None:
        device = "gpu" if (is_device_array(b) or is_device_array(A) or is_cupy_sparse(A)) else "cpu"
    solver = PCG(A, preconditioner=preconditioner, M=M, rtol=rtol, atol=atol, maxiter=maxiter,
                 device=device, mode=mode, variant=variant)
    result = solver.solve(b, x0, callback=callback)
    x = result.x
    if solver.device == "gpu" and not is_device_array(b):
        x = x.get()
    return x, result.info
