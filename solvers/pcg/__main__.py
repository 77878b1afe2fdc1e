"""Command line: ``python -m solvers.pcg --matrix file.mtx``.

Exit codes: 0 converged, 1 not converged or breakdown, 2 bad input or unusable device.
"""
import argparse
import json
import os
import sys

import numpy as np

from ..bundled import EXAMPLE_MATRICES, example_matrix
from ..cli_common import add_timeout_option, add_version_option, check_finite, option_name
from ..distributed.launch import several_ranks
from ..errors import DeviceError, InputError
from ..interrupts import exits_cleanly
from ..mmio import check_vector_output, read_vectors, write_vector
from ..outfiles import AtomicFile, check_target
from .preconditioners import AMG, Chebyshev
from .preconditioners.amg import COARSE_ROWS, MAX_COARSE_ROWS, SETUPS, SMOOTHERS, THETA
from .problem import load_problem
from .progress import ResidualProgress
from .solver import PCG

EXIT_CONVERGED, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


DEFAULTS_NOTE = """\
defaults: this command stops at rtol 1e-8 with the Jacobi preconditioner. The
library differs: solvers.cg follows scipy.sparse.linalg.cg (rtol 1e-5, atol 0,
no preconditioner, maxiter 10 n); solvers.PCG uses rtol 1e-5 with Jacobi.

under an MPI launcher (mpiexec -n N python -m solvers.pcg ...) the same options
run one distributed solve over the ranks; rank 0 reads the matrix and prints the
report. --mode and --progress apply to single-process runs only (refused there),
--unroll is the number of iterations between host status reads, and
--variant auto takes single-reduction below 500,000 rows per rank.

exit codes: 0 converged, 1 not converged (maximum iterations, breakdown,
NaN/Inf, a true residual above the tolerance), 2 bad input or no usable device,
130/143 stopped by SIGINT/SIGTERM (a file being written is left as it was)."""


def _example_path(name):
    """argparse type of ``--example``: the bundled file's path, or a usage error."""
    try:
        return str(example_matrix(name))
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m solvers.pcg",
        description="Solve A x = b (A symmetric positive definite) by preconditioned CG;\n"
                    "on a GPU the whole solve is one CUDA graph launch.",
        epilog=DEFAULTS_NOTE, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version_option(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--matrix", help="Matrix Market file (.mtx or .mtx.gz): coordinate or array, "
                                      "real or integer, general or symmetric")
    src.add_argument("--example", dest="matrix", type=_example_path, metavar="{" + ",".join(EXAMPLE_MATRICES) + "}",
                     help="a matrix shipped with the package instead of --matrix: "
                          + "; ".join(f"{k}: {v}" for k, v in EXAMPLE_MATRICES.items()))
    p.add_argument("--rhs", help="right-hand side b (.mtx, .npy or .txt), or k of them as an (n, k) array, "
                                 "solved together; default b = A @ ones, "
                                 "so the report can give the error against the known solution x = ones")
    p.add_argument("--x0", help="initial guess (.mtx, .npy or .txt), of the right-hand side's shape; default zeros")
    p.add_argument("--rtol", type=float, default=1e-8,
                   help="relative tolerance: stop when ||r|| <= max(atol, rtol ||b||) "
                        "(default 1e-8; the library's default is SciPy's 1e-5)")
    p.add_argument("--atol", type=float, default=0.0, help="absolute tolerance (default 0)")
    p.add_argument("--maxiter", type=int, help="iteration limit (default 10 n, as in SciPy)")
    p.add_argument("--precond", choices=("none", "jacobi", "chebyshev", "amg"), default="jacobi",
                   help="preconditioner: jacobi (divide by the diagonal), none (plain CG), chebyshev "
                        "(a Chebyshev polynomial in the Jacobi-scaled matrix) or amg (one smoothed-aggregation "
                        "V-cycle; needs PyAMG); on the GPU chebyshev and amg run under the classic variant "
                        "(default jacobi; solvers.cg's default is none, as in SciPy)")
    p.add_argument("--cheb-degree", type=int, metavar="K",
                   help="degree of the Chebyshev polynomial: of --precond chebyshev, or of the smoother of "
                        "--precond amg (default 3)")
    p.add_argument("--amg-smoother", choices=SMOOTHERS,
                   help="relaxation on every AMG level: chebyshev (default) or weighted jacobi")
    p.add_argument("--amg-sweeps", type=int, metavar="N",
                   help="steps of the jacobi AMG smoother before and after the coarse correction (default 1)")
    p.add_argument("--amg-coarse-size", type=int, metavar="N",
                   help="AMG coarsening stops at this many nodes; the coarsest level is solved with a dense "
                        f"inverse (default {COARSE_ROWS:,} rows' worth: {COARSE_ROWS:,} / k nodes with k "
                        f"near-nullspace vectors; at most {MAX_COARSE_ROWS})")
    p.add_argument("--amg-setup", choices=SETUPS,
                   help="where the AMG hierarchy is built: cpu (PyAMG), gpu (on the device, MIS(2) aggregation; "
                        "the levels come back for a CPU solve) or auto (the GPU for a matrix on the device, "
                        "else PyAMG; default)")
    p.add_argument("--amg-theta", type=float, metavar="THETA",
                   help=f"AMG strength-of-connection threshold of the symmetric measure, in [0, 1) (default {THETA})")
    p.add_argument("--amg-hierarchy-dtype", choices=("float64", "float32"),
                   help="precision the AMG levels are stored and cycled in: float32 inside float64 CG halves "
                        "the cycle's memory traffic (default: float32 for a float64 solve on the GPU, else --dtype)")
    p.add_argument("--nullspace", metavar="FILE",
                   help="AMG near-nullspace: k vectors of n entries (.npy or text of shape (n, k), or Matrix "
                        "Market array), e.g. rigid body modes for elasticity (default: constants)")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                   help="where to solve: gpu needs CuPy and a CUDA device; auto takes the GPU when "
                        "there is one, else the CPU, and the report's note says why (default auto)")
    p.add_argument("--mode", choices=("auto", "eager", "graph", "while"), default="auto",
                   help="GPU driver: eager (plain launches), graph (a captured graph relaunched) or "
                        "while (one launch, a WHILE node decides on the GPU); auto takes while where "
                        "CUDA supports it (>= 12.4), else graph; the CPU takes auto or eager (default auto)")
    p.add_argument("--unroll", type=int, default=32,
                   help="iterations per kernel launch on the GPU, hence per graph launch (graph) or "
                        "per WHILE pass (while) (default 32)")
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                   help="floating-point type of the matrix, vectors and arithmetic (default float64)")
    p.add_argument("--output", help="write the solution x to this file, in the format its suffix names: "
                                    ".mtx, .mtx.gz, .npy or .txt")
    p.add_argument("--json", metavar="FILE",
                   help="write the report, with the residual history, as JSON to FILE; "
                        "'-' writes it to stdout and the human-readable report to stderr")
    p.add_argument("--plot", help="plot the convergence history to this PNG (needs matplotlib)")
    p.add_argument("--progress", action="store_true",
                   help="show the iteration and residual norm live on stderr while solving "
                        "(a redrawn line on a terminal, plain lines once a second otherwise)")
    p.add_argument("--variant", choices=("auto", "classic", "single-reduction"), default="auto",
                   help="classic PCG, or the single-reduction (Chronopoulos-Gear) form: one grid-wide "
                        "reduction per iteration (one allreduce under mpiexec); "
                        "auto: on the on-chip path classic in one block holding whole rows in registers, "
                        "else single-reduction; on the grid path single-reduction up to 131,072 rows, else "
                        "classic (default auto)")
    p.add_argument("--format", choices=("auto", "dia", "ell", "sell", "csr"), default="auto",
                   help="matrix storage on the GPU: DIA (ELL with every entry on a diagonal of the widest "
                        "row, e.g. stencils on grids; no column indices), ELL (rows of nearly equal length), "
                        "SELL-C-sigma (any rows; very long ones split over several warps) or CSR; "
                        "auto: DIA or else ELL when the rows allow, else SELL")
    p.add_argument("--path", choices=("auto", "grid", "on-chip"), default="auto",
                   help="GPU kernel: the whole GPU with grid-wide barriers, or the iteration inside one "
                        "thread block or cluster, or over a few clusters (small systems); auto: on chip up "
                        "to 71,680 rows (above 16,384 single-reduction over several clusters) unless many "
                        "product reads cross blocks (the report says which ran)")
    p.add_argument("--reorder", choices=("auto", "none", "rcm", "neighbours"), default="auto",
                   help="symmetric reordering, undone on the solution; rcm: reverse Cuthill-McKee at set-up "
                        "(on the GPU for a GPU solve, SciPy's on the CPU); neighbours: rows sharing a neighbour "
                        "numbered together, at set-up (a few sorts); auto, on the GPU: where SELL lays the rows "
                        "out by neighbours, or by length over a scattered numbering, the rows numbered as laid "
                        "out (no cost beyond the format's set-up), else the neighbours' renumbering for a matrix "
                        "whose product reads are scattered, once the iterations run as numbered would have paid "
                        "for it (the report says what was planned or done and why)")
    add_timeout_option(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("-q", "--quiet", action="store_true", help="print one summary line")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="also print the recursive and true residual norms and ||b||")
    return p


def _report(problem, solver, result, error):
    return {
        **_setup_report(problem, solver),
        "device": result.device, "mode": result.mode, "mode_note": result.mode_note,
        "preconditioner_details": getattr(solver, "preconditioner_details", {}),
        "preconditioner_setup_time_s": getattr(solver, "preconditioner_setup_time", None),
        "variant": solver.variant, "path_note": getattr(solver, "path_note", None),
        "reorder_time_s": getattr(solver, "reorder_time", 0.0),
        "converged": result.converged, "reason": result.reason.label, "info": result.info,
        "iterations": result.iterations,
        "residual_norm": result.residual_norm, "true_residual_norm": result.true_residual_norm,
        "true_relative_residual": result.relative_residual, "b_norm": result.b_norm,
        "tolerance": result.tolerance, "error_vs_exact": error,
        "setup_time_s": result.setup_time, "solve_time_s": result.solve_time, "loop_time_s": result.loop_time,
        "capture_time_s": result.capture_time,
        "time_per_iteration_s": result.time_per_iteration if result.iterations else None,
        "history": None if result.history is None else [float(v) for v in result.history],
    }


def _report_columns(problem, solver, result):
    """The report of k right-hand sides solved together: the set-up once, the outcome a column."""
    rep = _setup_report(problem, solver)
    rep.update({
        "device": result.device, "mode": result.mode, "right_hand_sides": problem.columns,
        "converged": bool(result.converged.all()), "converged_columns": int(result.converged.sum()),
        "reasons": [r.label for r in result.reasons], "info": [int(v) for v in result.info],
        "iterations": [int(v) for v in result.iterations],
        "residual_norms": [float(v) for v in result.residual_norms],
        "true_residual_norms": [float(v) for v in result.true_residual_norms],
        "true_relative_residuals": [float(v) for v in result.relative_residuals],
        "b_norms": [float(v) for v in result.b_norms], "tolerances": [float(v) for v in result.tolerances],
        "setup_time_s": result.setup_time, "solve_time_s": result.solve_time, "loop_time_s": result.loop_time,
        "time_per_iteration_s": result.time_per_iteration if result.iterations.max() else None,
    })
    return rep


def _setup_report(problem, solver):
    """What the set-up chose, shared by the reports of one and of k right-hand sides."""
    return {
        "matrix": problem.name, "n": problem.n, "nnz": problem.nnz,
        "device_name": getattr(solver, "device_name", None),
        "preconditioner": solver.preconditioner, "dtype": str(solver.dtype),
        "path": getattr(solver, "path", None), "format": getattr(solver, "format", None),
        "reordering": getattr(solver, "reordering", None),
    }


def _print_columns(rep, args):
    """Print the human-readable report of k right-hand sides (a line a column with ``--verbose``)."""
    out = _human_stream(args)
    k, done = rep["right_hand_sides"], rep["converged_columns"]
    status = f"{done} of {k} right-hand sides converged"
    its, rel = rep["iterations"], rep["true_relative_residuals"]
    worst = max(range(k), key=lambda j: rel[j] if rel[j] == rel[j] else float("inf"))  # NaN counts as worst
    if args.quiet:
        print(f"{rep['matrix']}: {status}, {min(its)} to {max(its)} iterations, worst true relative residual "
              f"{rel[worst]:.3e}", file=out)
        return
    where = rep["device"] + (f" ({rep['device_name']})" if rep["device_name"] else "")
    lines = [f"matrix                  {rep['matrix']}  (n = {rep['n']:,}, nnz = {rep['nnz']:,})",
             f"device                  {where}, mode {rep['mode']}",
             f"preconditioner          {rep['preconditioner']}, {rep['dtype']}"]
    if rep["format"]:
        lines.append(f"matrix format           {rep['format']}")
    lines += [f"result                  {status}, {min(its)} to {max(its)} iterations",
              f"true relative residual  {rel[worst]:.3e} at most (column {worst})"]
    per_it = rep["time_per_iteration_s"]
    per_it_text = f"  ({per_it * 1e6:.2f} us per iteration, all columns)" if per_it else ""
    lines += [f"setup time              {rep['setup_time_s'] * 1e3:.3f} ms",
              f"solve time              {rep['solve_time_s'] * 1e3:.3f} ms{per_it_text}"]
    if args.verbose:
        lines += [f"column {j:<16} {rep['reasons'][j]}, {its[j]} iterations, true relative residual {rel[j]:.3e}"
                  for j in range(k)]
    print("\n".join(lines), file=out)


def _human_stream(args):
    """Where the human-readable report goes: stderr when ``--json -`` takes stdout."""
    return sys.stderr if args.json == "-" else sys.stdout


def _print_report(rep, args, preconditioner_lines=()):
    """Print the human-readable report; ``preconditioner_lines`` are ``(label, text)`` pairs."""
    status = "converged" if rep["converged"] else "NOT CONVERGED: " + rep["reason"]
    out = _human_stream(args)
    if args.quiet:
        print(f"{rep['matrix']}: {status}, {rep['iterations']} iterations, "
              f"true relative residual {rep['true_relative_residual']:.3e}", file=out)
        return
    where = rep["device"] + (f" ({rep['device_name']})" if rep["device_name"] else "")
    lines = [
        f"matrix                  {rep['matrix']}  (n = {rep['n']:,}, nnz = {rep['nnz']:,})",
        f"device                  {where}, mode {rep['mode']}",
        f"preconditioner          {rep['preconditioner']}, {rep['dtype']}, {rep['variant']} PCG",
    ]
    lines += [f"{label:<23} {text}" for label, text in preconditioner_lines]
    if rep["path"] and rep["device"] == "gpu":
        lines.append(f"kernel path             {rep['path']}" + (f" ({rep['path_note']})" if rep["path_note"] else ""))
    if rep["format"]:
        lines.append(f"matrix format           {rep['format']}")
    if rep["reordering"] and (rep["device"] == "gpu" or rep["reorder_time_s"]):
        timing = f" ({rep['reorder_time_s'] * 1e3:.3f} ms)" if rep["reorder_time_s"] else ""
        lines.append(f"reordering              {rep['reordering']}{timing}")
    lines += [
        f"result                  {status} {'in' if rep['converged'] else 'after'} {rep['iterations']} iterations",
        f"true relative residual  {rep['true_relative_residual']:.3e}  "
        f"(||b - A x|| / ||b||; stop when ||r|| <= {rep['tolerance']:.3e})",
    ]
    if rep["error_vs_exact"] is not None:
        lines.append(f"error vs exact solution {rep['error_vs_exact']:.3e}  (b = A @ ones, ||x - 1|| / ||1||)")
    own = rep["preconditioner_setup_time_s"] if rep["preconditioner_details"] else None
    own_text = f"  (preconditioner {own * 1e3:.3f} ms)" if own is not None else ""
    lines.append(f"setup time              {rep['setup_time_s'] * 1e3:.3f} ms{own_text}")
    per_it = rep["time_per_iteration_s"]
    per_it_text = f"  ({per_it * 1e6:.2f} us per iteration)" if per_it else ""
    capture = rep["capture_time_s"]
    capture_text = f"  (graph capture {capture * 1e3:.3f} ms)" if capture else ""
    lines.append(f"solve time              {rep['solve_time_s'] * 1e3:.3f} ms{per_it_text}{capture_text}")
    if rep["mode_note"]:
        lines.append(f"note                    {rep['mode_note']}")
    if args.verbose:
        lines.append(f"recursive residual      {rep['residual_norm']:.6e}")
        lines.append(f"true residual norm      {rep['true_residual_norm']:.6e}")
        lines.append(f"||b||                   {rep['b_norm']:.6e}")
    print("\n".join(lines), file=out)


def _plot_format(path):
    return os.path.splitext(path)[1][1:].lower()


def _require_matplotlib(path):
    """Fail before solving, not after, when the plot cannot be made or written."""
    try:
        import matplotlib
    except ImportError:
        raise InputError("--plot needs matplotlib (pip install matplotlib)", path) from None
    matplotlib.use("Agg")
    from matplotlib.backend_bases import FigureCanvasBase
    formats = FigureCanvasBase.get_supported_filetypes()
    if _plot_format(path) not in formats:
        raise InputError(f"unknown image format (the name must end in one of "
                         f"{', '.join('.' + f for f in sorted(formats))})", path)
    check_target(path, "plot")


def _plot(path, history, title):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.semilogy(range(len(history)), history)
    ax.set_xlabel("iteration")
    ax.set_ylabel("||r|| (recursive)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    try:
        with AtomicFile(path, "plot") as f:
            fig.savefig(f, dpi=120, format=_plot_format(path))
    finally:
        plt.close(fig)


def _write_json(path, rep):
    if path == "-":
        json.dump(rep, sys.stdout, indent=2)
        print()
        return
    with AtomicFile(path, "JSON report", text=True) as f:
        json.dump(rep, f, indent=2)


def _write_output(path, x):
    write_vector(path, x.get() if hasattr(x, "get") else x)


# The options of one preconditioner, with what they need to apply.
PRECONDITIONER_OPTIONS = {
    "cheb_degree": ("--precond chebyshev, or amg with the chebyshev smoother",
                    lambda a: a.precond == "chebyshev" or (a.precond == "amg" and a.amg_smoother != "jacobi")),
    "amg_smoother": ("--precond amg", lambda a: a.precond == "amg"),
    "amg_sweeps": ("--precond amg --amg-smoother jacobi", lambda a: a.precond == "amg" and a.amg_smoother == "jacobi"),
    "amg_coarse_size": ("--precond amg", lambda a: a.precond == "amg"),
    "amg_setup": ("--precond amg", lambda a: a.precond == "amg"),
    "amg_theta": ("--precond amg", lambda a: a.precond == "amg"),
    "amg_hierarchy_dtype": ("--precond amg", lambda a: a.precond == "amg"),
    "nullspace": ("--precond amg", lambda a: a.precond == "amg"),
}


def _check_preconditioner_options(args):
    for name, (needs, applies) in PRECONDITIONER_OPTIONS.items():
        if getattr(args, name) is not None and not applies(args):
            raise InputError(f"applies to {needs}", option_name(name))
    for name, lowest, highest in (("cheb_degree", 1, None), ("amg_sweeps", 1, None),
                                  ("amg_coarse_size", 1, MAX_COARSE_ROWS)):
        value = getattr(args, name)
        if value is not None and (value < lowest or (highest is not None and value > highest)):
            span = f">= {lowest}" if highest is None else f"from {lowest} to {highest}"
            raise InputError(f"must be {span}, got {value}", option_name(name))
    if args.amg_theta is not None and not 0 <= args.amg_theta < 1:
        raise InputError(f"must lie in [0, 1), got {args.amg_theta}", option_name("amg_theta"))
    if args.amg_hierarchy_dtype == "float64" and args.dtype == "float32":
        raise InputError("float64 levels inside float32 CG gain nothing; take float32",
                         option_name("amg_hierarchy_dtype"))


def _preconditioner(args, n):
    """What ``--precond`` and its options ask for: a name, or an object holding the options given."""
    if args.precond == "chebyshev":
        return Chebyshev() if args.cheb_degree is None else Chebyshev(args.cheb_degree)
    if args.precond != "amg":
        return args.precond
    options = {key: value for key, value in (("smoother", args.amg_smoother), ("degree", args.cheb_degree),
                                             ("sweeps", args.amg_sweeps), ("coarse_size", args.amg_coarse_size),
                                             ("setup", args.amg_setup), ("theta", args.amg_theta),
                                             ("hierarchy_dtype", args.amg_hierarchy_dtype))
               if value is not None}
    if args.nullspace is None:
        return AMG(**options)
    try:
        return AMG(near_nullspace=read_vectors(args.nullspace, n), **options)
    except InputError as exc:  # a zero vector, more vectors than rows
        raise exc.naming(args.nullspace) from None


def _check_options(args, writes=True):
    """Refuse bad options, and (``writes``) outputs that could not be written, before any work."""
    check_finite(args, ("rtol", "atol"))
    _check_preconditioner_options(args)
    if args.maxiter is not None and args.maxiter < 0:
        raise InputError("--maxiter must be >= 0")
    if args.rtol < 0 or args.atol < 0:
        raise InputError("--rtol and --atol must be >= 0")
    if args.unroll < 1:
        raise InputError("--unroll must be >= 1")
    if writes and args.output:
        check_vector_output(args.output)
    if writes and args.json and args.json != "-":
        check_target(args.json, "JSON report")
    if writes and args.plot:
        _require_matplotlib(args.plot)


def _solve(solver, problem, show_progress):
    if not show_progress:
        return solver.solve(problem.b, problem.x0)
    progress = ResidualProgress()
    try:
        result = solver.solve(problem.b, problem.x0, progress=progress)
    except BaseException:
        progress.close()
        raise
    progress.close(result.iterations, result.residual_norm)
    return result


@exits_cleanly(held=several_ranks)  # a rank holds signals until it can end the whole job
def main(argv=None):
    """Run the CLI; returns the exit code."""
    if several_ranks():  # started by an MPI launcher: solvers.distributed runs it, rank 0 reports
        from ..distributed.cli import run_distributed
        return run_distributed(build_parser(), argv, sys.modules[__name__])
    args = build_parser().parse_args(argv)
    try:
        _check_options(args)
        if args.timeout is not None:
            raise InputError("applies to runs under an MPI launcher (mpiexec, srun), where a rank can stop",
                             "--timeout")
        problem = load_problem(args.matrix, args.rhs, args.x0)
        columns = problem.columns is not None
        for name, given in (("--plot", args.plot), ("--progress", args.progress)):
            if columns and given:
                raise InputError(f"follows one right-hand side; {args.rhs} holds {problem.columns}", name)
        preconditioner = _preconditioner(args, problem.n)
        try:
            solver = PCG(problem.A, preconditioner=preconditioner, rtol=args.rtol, atol=args.atol,
                         maxiter=args.maxiter, device=args.device, mode=args.mode, dtype=args.dtype,
                         unroll=args.unroll, record_history=bool(args.plot or args.json) and not columns,
                         variant=args.variant, matrix_format=args.format, reorder=args.reorder, path=args.path)
        except InputError as exc:  # what is wrong with the matrix (a zero diagonal, ...) names its file
            raise exc.naming(args.matrix) from None
        result = _solve(solver, problem, args.progress)
        if columns:
            rep = _report_columns(problem, solver, result)
            _print_columns(rep, args)
        else:
            rep = _report(problem, solver, result, problem.solution_error(result.x))
            _print_report(rep, args, solver.preconditioner_lines)
        if args.output:
            _write_output(args.output, result.x)
        if args.json:
            _write_json(args.json, rep)
        if args.plot and result.history is not None:
            _plot(args.plot, result.history, f"{problem.name}: PCG ({args.precond})")
    except (InputError, DeviceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_CONVERGED if bool(np.all(result.converged)) else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
