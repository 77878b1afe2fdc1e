"""Implicit (backward Euler) heat equation: one PCG set-up, one solve per time step.

u_t = laplace(u) on the unit square, u = 0 on the walls, u(0) = sin(pi x) sin(pi y), whose exact
solution is exp(-2 pi^2 t) sin(pi x) sin(pi y). Each step solves (I + dt L) u_new = u_old with the
previous field as the initial guess; the solver (and on a GPU its captured graph) is set up once.

    python examples/heat_implicit.py [--small] [--device auto|cpu|gpu]
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
    ap.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    args = ap.parse_args(argv)
    m, steps = (64, 20) if args.small else (512, 100)
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
              f"({its:.1f} PCG iterations per step, graph instantiations {solver.instantiations})")
    u_ref, per_step = run_scipy(A, u0, steps, rtol)
    print(f"SciPy cg (CPU)     : {per_step * 1e3:8.3f} ms per step")
    err = np.abs(u - exact).max() / np.abs(exact).max()
    agree = np.abs(u - u_ref).max() / np.abs(u_ref).max()
    print(f"max error vs analytic solution: {err:.3e} (relative to max |u|)")
    print(f"max difference from SciPy: {agree:.3e}")
    return 0 if err < 5e-2 and agree < 1e-6 else 1


if __name__ == "__main__":
    raise SystemExit(main())
