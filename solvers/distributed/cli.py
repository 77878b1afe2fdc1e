"""``python -m solvers.pcg`` under an MPI launcher: the distributed run behind the same CLI.

Every rank runs this; rank 0 alone prints and writes files. Errors found while
setting up are agreed by all ranks (each exits with code 2, rank 0 prints the
message); anything failing later aborts the whole job with ``MPI_Abort``.
"""
import sys

from ..errors import DeviceError, InputError
from .comm import RankError, abort_on_error, agree, world

EXIT_CONVERGED, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def _split_lines(rep):
    total = rep["compute_time_s"] + rep["communication_time_s"]
    share = rep["communication_time_s"] / total if total > 0 else 0.0
    return [f"ranks                   {rep['ranks']} (variant {rep['variant']})",
            f"time split              compute {rep['compute_time_s'] * 1e3:.3f} ms, "
            f"communication {rep['communication_time_s'] * 1e3:.3f} ms ({share:.0%})"]


def run_distributed(args, cli):
    """Solve the problem ``args`` describe over all ranks; return this rank's exit code.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed options of ``python -m solvers.pcg``.
    cli : module
        The CLI module, whose ``_report``, ``_print_report``, ``_human_stream``,
        ``_require_matplotlib``, ``_write_output``, ``_write_json`` and ``_plot``
        format and write the results.
    """
    try:
        comm = world()
    except DeviceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    root = comm.Get_rank() == 0
    try:
        with abort_on_error(comm):
            return _run(comm, root, args, cli)
    except (InputError, DeviceError, RankError) as exc:
        if root:
            print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _run(comm, root, args, cli):
    from .problem import read_distributed
    from .solver import DistributedPCG

    def check_options():
        if args.mode != "auto":
            raise InputError("--mode applies to single-process runs; distributed runs always use "
                             "graph segments between NCCL calls on GPUs")
        if args.progress:
            raise InputError("--progress applies to single-process runs; distributed runs read the "
                             "device status only every --unroll iterations")
        if args.unroll < 1:
            raise InputError("--unroll must be >= 1")
        if args.reorder == "rcm":
            raise InputError("--reorder rcm applies to single-process runs; distributed runs keep the "
                             "numbering, whose row blocks are the ranks' parts")
        if args.format != "auto":
            raise InputError("--format applies to single-process runs; each rank of a distributed run "
                             "chooses the storage of its own block")
        if args.plot and root:
            cli._require_matplotlib(args.plot)

    agree(comm, check_options)
    problem = read_distributed(comm, args.matrix, args.rhs, args.x0, dtype=args.dtype)
    solver = DistributedPCG(problem.rows, problem.bounds, comm, preconditioner=args.precond, rtol=args.rtol,
                            atol=args.atol, maxiter=args.maxiter, device=args.device, variant=args.variant,
                            dtype=args.dtype, record_history=bool(args.plot or args.json),
                            check_every=args.unroll)
    result = solver.solve(problem.b, problem.x0)
    rep = cli._report(problem, solver, result, problem.solution_error(result.x))
    rep.update(ranks=result.ranks, variant=result.variant, compute_time_s=result.compute_time,
               communication_time_s=result.communication_time)
    x = solver.gather(result.x) if args.output else None

    def write():
        if not root:
            return
        cli._print_report(rep, args)
        if not args.quiet:
            print("\n".join(_split_lines(rep)), file=cli._human_stream(args))
        if args.output:
            cli._write_output(args.output, x)
        if args.json:
            cli._write_json(args.json, rep)
        if args.plot and result.history is not None:
            cli._plot(args.plot, result.history, f"{problem.name}: PCG ({args.precond}), {result.ranks} ranks")

    agree(comm, write)
    return EXIT_CONVERGED if result.converged else EXIT_FAILED
