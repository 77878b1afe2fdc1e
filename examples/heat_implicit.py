"""Implicit (backward Euler) heat equation: one PCG set-up, one solve per time step.

u_t = laplace(u) on the unit square, u = 0 on the walls, u(0) = sin(pi x) sin(pi y), whose exact
solution is exp(-2 pi^2 t) sin(pi x) sin(pi y). Each step solves (I + dt L) u_new = u_old with the
previous field as the initial guess; the solver (and on a GPU its captured graph) is set up once.

On a GPU the example also captures the whole time step (right-hand side, solve, update) into one
CUDA graph of its own (``PCG.enqueue`` inside a CuPy stream capture) and replays it every step: no
host synchronisation between steps.

    python examples/heat_implicit.py [--small | --size M] [--device auto|cpu|gpu]
"""
import argparse
import time

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

import solvers
from solvers.gallery import poisson


def step_matrix(m, dt):
    """``I + dt L`` on an m x m interior grid with spacing h = 1 / (m + 1)."""
    h = 1.0 / (m + 1)
    return (sp.identity(m * m, format="csr") + (dt / h**2) * poisson((m, m))).tocsr()


def initial_field(m):
    x = np.arange(1, m + 1) / (m + 1)
    return np.outer(np.sin(np.pi * x), np.sin(np.pi * x)).ravel()


def run_project(A, u0, steps, device, mode, rtol):
    solver = solvers.PCG(A, preconditioner="jacobi", rtol=rtol, device=device, mode=mode)
    u = u0  # after the first step u stays where the solver runs (a CuPy array on a GPU)
    iterations = 0
    t0 = time.perf_counter()
    for _ in range(steps):
        res = solver.solve(u, x0=u)
        if not res.converged:
            raise RuntimeError(f"step did not converge: {res.reason.label}")
        u, iterations = res.x, iterations + res.iterations
    elapsed = time.perf_counter() - t0
    u = u.get() if hasattr(u, "get") else u
    return u, elapsed / steps, iterations / steps, solver


def captured_step(A, u0, rtol):
    """The whole time step as one CUDA graph: ``(replay, solver, u)``; ``replay()`` advances ``u`` one step.

    rhs = u (backward Euler; a source term would be added here), solve into u_new
    from u, then u = u_new, all enqueued on one stream and captured once.
    """
    import cupy
    solver = solvers.PCG(A, preconditioner="jacobi", rtol=rtol, device="gpu", reorder="none")
    u = cupy.asarray(u0)
    rhs, u_new = cupy.empty_like(u), cupy.empty_like(u)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            rhs[...] = u
            solver.enqueue(rhs, u_new, x0=u)
            u[...] = u_new
        finally:
            graph = stream.end_capture()
    graph.upload(stream)
    return (lambda: graph.launch(stream)), stream, solver, u


def run_captured(A, u0, steps, rtol):
    replay, stream, solver, u = captured_step(A, u0, rtol)
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        replay()
    stream.synchronize()
    elapsed = time.perf_counter() - t0
    reason, iterations, _, _ = solver.enqueued_result()
    if reason is not solvers.Reason.CONVERGED:
        raise RuntimeError(f"last step did not converge: {reason.label}")
    return u.get(), elapsed / steps, iterations, solver


def run_scipy(A, u0, steps, rtol):
    M = sp.diags(1.0 / A.diagonal())
    u = u0.copy()
    t0 = time.perf_counter()
    for _ in range(steps):
        u, info = spla.cg(A, u, x0=u, rtol=rtol, M=M)
        assert info == 0
    return u, (time.perf_counter() - t0) / steps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="64 x 64 grid, 20 steps (runs in seconds on a CPU)")
    ap.add_argument("--size", type=int, default=512, help="grid side M (M x M unknowns, 100 steps; default 512)")
    ap.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    args = ap.parse_args(argv)
    m, steps = (64, 20) if args.small else (args.size, 100)
    t_end, rtol = 0.05, 1e-10
    dt = t_end / steps
    A, u0 = step_matrix(m, dt), initial_field(m)
    exact = np.exp(-2 * np.pi**2 * t_end) * u0
    print(f"heat equation, {m} x {m} grid, {steps} backward Euler steps of dt = {dt:g}")

    device = solvers.PCG(A, device=args.device, mode="auto").device
    modes = ("while", "graph", "eager") if device == "gpu" else ("auto",)
    u = None
    for mode in modes:
        u, per_step, its, solver = run_project(A, u0, steps, device, mode, rtol)
        print(f"graphsolve-cuda {device} {solver.mode:>6}: {per_step * 1e3:8.3f} ms per step "
              f"({its:.1f} PCG iterations per step, graph instantiations {solver.instantiations}, "
              f"path {solver.path})")
        if mode == "while":
            plain = per_step
    if device == "gpu":
        u_step, per_step, its, solver = run_captured(A, u0, steps, rtol)
        print(f"graphsolve-cuda gpu captured step: {per_step * 1e3:8.3f} ms per step ({its} PCG iterations in the "
              f"last step, the whole step one graph; {plain / per_step:.1f}x the while-mode step)")
        print(f"captured step vs solve per step: max difference {np.abs(u_step - u).max() / np.abs(u).max():.3e}")
    u_ref, per_step = run_scipy(A, u0, steps, rtol)
    print(f"SciPy cg (CPU)     : {per_step * 1e3:8.3f} ms per step")
    err = np.abs(u - exact).max() / np.abs(exact).max()
    agree = np.abs(u - u_ref).max() / np.abs(u_ref).max()
    print(f"max error vs analytic solution: {err:.3e} (relative to max |u|)")
    print(f"max difference from SciPy: {agree:.3e}")
    return 0 if err < 5e-2 and agree < 1e-6 else 1


if __name__ == "__main__":
    raise SystemExit(main())
