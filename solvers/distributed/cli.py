"""``python -m solvers.pcg`` under an MPI launcher: the distributed run behind the same CLI.

Every rank runs this; rank 0 alone prints and writes files. Before any
collective that depends on them, the ranks agree on their command lines: each
parses its own (a rank whose command line is refused does not leave the others
waiting), checks its own options, then compares them with rank 0's, which
rank 0 broadcasts; a difference (an MPMD launch with another ``--variant``,
``--output`` on one rank only) ends every rank with one message and exit code
2. Errors found while setting up are agreed the same way; anything failing
later, a signal included, aborts the whole job with ``MPI_Abort``. With a
watchdog timeout (``--timeout`` or ``$GRAPHSOLVE_TIMEOUT``), a rank that makes
no progress for that long (another rank stopped or hung) aborts the job.
"""
import contextlib
import sys

from .. import interrupts, watchdog
from ..errors import DeviceError, InputError
from ..cli_common import option_name, timeout_seconds
from .comm import RankError, abort, abort_on_error, agree, world_or_report

EXIT_CONVERGED, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def _split_lines(rep):
    total = rep["compute_time_s"] + rep["communication_time_s"]
    share = rep["communication_time_s"] / total if total > 0 else 0.0
    return [f"ranks                   {rep['ranks']} (variant {rep['variant']})",
            f"time split              compute {rep['compute_time_s'] * 1e3:.3f} ms, "
            f"communication {rep['communication_time_s'] * 1e3:.3f} ms ({share:.0%})"]


class _Refused(Exception):
    """argparse refused this rank's command line."""


def _parse(parser, argv):
    """``(args, None)``, ``(None, message)`` for a refused command line, or ``(None, code)`` after --help.

    argparse would exit this rank alone (before MPI starts), leaving the
    others waiting for it: here the outcome is returned instead.
    """
    def refuse(message):
        raise _Refused(message)

    parser.error = refuse
    try:
        return parser.parse_args(argv), None
    except _Refused as exc:
        return None, str(exc)
    except SystemExit as exc:  # --help: printed, and asked to stop
        return None, exc.code if isinstance(exc.code, int) else 0


def _shown(value):
    return "not given" if value is None or value is False else repr(value)


def run_distributed(parser, argv, cli):
    """Solve the problem the command line describes over all ranks; return this rank's exit code.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The parser of ``python -m solvers.pcg``.
    argv : list of str or None
        This rank's arguments (None: ``sys.argv``).
    cli : module
        The CLI module, whose ``_check_options``, ``_report``, ``_print_report``,
        ``_human_stream``, ``_write_output``, ``_write_json`` and ``_plot`` check,
        format and write.
    """
    # A signal before MPI is up could not end the other ranks (they would wait for this one): it is
    # held (from the CLI's start, see interrupts.exits_cleanly) until this rank can abort the whole
    # job, from inside abort_on_error; the hold ends there too, so no signal falls between.
    try:
        with contextlib.ExitStack() as guard:
            with interrupts.deferred(act_at_exit=False):
                args, failure = _parse(parser, argv)
                comm = world_or_report()
                if comm is None:
                    return EXIT_BAD_INPUT
                root = comm.Get_rank() == 0
                try:
                    own_timeout = timeout_seconds(args) if args is not None else None
                except InputError:
                    own_timeout = None  # refused below, together with the other ranks

                def stalled(idle):
                    abort(comm, f"no progress for {idle:.0f} s (watchdog timeout {own_timeout:g} s): another "
                                "rank is stopped or hung; ending the job")

                guard.enter_context(abort_on_error(comm))
                guard.enter_context(watchdog.watching(own_timeout, stalled))
            interrupts.release()
            interrupts.act_on_pending()
            exits = comm.allgather(failure if args is None and not isinstance(failure, str) else None)
            if all(code is not None for code in exits):  # every rank printed its help
                return exits[comm.Get_rank()]
            args = _agree_on_options(comm, root, args, failure, cli)
            watchdog.beat()
            return _run(comm, root, args, cli)
    except (InputError, DeviceError, RankError) as exc:
        if root:
            print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _agree_on_options(comm, root, args, failure, cli):
    """Every rank's own options valid and the same as rank 0's, or an agreed InputError."""

    def check_own():
        if args is None:
            raise InputError(f"bad command line: {failure}" if isinstance(failure, str)
                             else "stopped after printing the help; start every rank with the same options")
        cli._check_options(args, writes=root)
        if args.mode != "auto":
            raise InputError("--mode applies to single-process runs; distributed runs always use "
                             "graph segments between NCCL calls on GPUs")
        if args.progress:
            raise InputError("--progress applies to single-process runs; distributed runs read the "
                             "device status only every --unroll iterations")
        if args.reorder in ("rcm", "neighbours"):
            raise InputError(f"--reorder {args.reorder} applies to single-process runs; distributed runs keep "
                             "the numbering, whose row blocks are the ranks' parts")
        if args.format != "auto":
            raise InputError("--format applies to single-process runs; each rank of a distributed run "
                             "chooses the storage of its own block")
        args.timeout = timeout_seconds(args)  # the value in force, compared with rank 0's below

    agree(comm, check_own)
    mine = vars(args)
    reference = comm.bcast(mine if root else None, root=0)

    def same_as_rank_0():
        for name in sorted(set(mine) | set(reference)):
            if mine.get(name) != reference.get(name):
                raise InputError(f"options differ from rank 0's: {option_name(name)} is {_shown(mine.get(name))} "
                                 f"here but {_shown(reference.get(name))} on rank 0; start every rank with the "
                                 "same options")

    agree(comm, same_as_rank_0)
    return args


def _run(comm, root, args, cli):
    from .problem import read_distributed
    from .solver import DistributedPCG

    problem = read_distributed(comm, args.matrix, args.rhs, args.x0)
    watchdog.beat()
    try:
        solver = DistributedPCG(problem.rows, problem.bounds, comm, preconditioner=args.precond, rtol=args.rtol,
                                atol=args.atol, maxiter=args.maxiter, device=args.device, variant=args.variant,
                                dtype=args.dtype, record_history=bool(args.plot or args.json),
                                check_every=args.unroll)
    except InputError as exc:  # what is wrong with the matrix (a zero diagonal, ...) names its file
        error = exc.naming(args.matrix)
        error.agreed = getattr(exc, "agreed", False)
        raise error from None
    watchdog.beat()
    result = solver.solve(problem.b, problem.x0)
    watchdog.beat()
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
