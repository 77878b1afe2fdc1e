"""MPI (and NCCL) plumbing for the distributed solvers, timed and fail-safe.

Two rules keep a failing run from hanging:

* set-up steps run through :func:`agree`: every rank learns whether any rank
  failed, and all raise the same one-line error (then exit normally with the
  CLI's code);
* anything that goes wrong later, when the ranks are no longer in step, goes
  through :func:`abort_on_error`, which prints the error and calls
  ``MPI_Abort`` so the launcher ends every rank. A rank killed outright is
  ended by the launcher itself (``mpiexec`` / ``mpirun`` kill the job).
"""
import contextlib
import os
import sys
import time

import numpy as np

from .. import watchdog
from ..errors import DeviceError, InputError
from ..interrupts import Interrupted

# Seconds between printing a rank's error and MPI_Abort (see abort_on_error).
ABORT_GRACE_SECONDS = 0.5


def world():
    """``MPI.COMM_WORLD`` after checking it matches the launcher (imports mpi4py)."""
    try:
        from mpi4py import MPI
    except ImportError:
        raise DeviceError("this run was started by an MPI launcher but mpi4py is not installed "
                          "(pip install mpi4py)") from None
    from .launch import check_world
    try:
        check_world(MPI.COMM_WORLD)
    except RuntimeError as exc:
        raise DeviceError(str(exc)) from None
    return MPI.COMM_WORLD


def world_or_report():
    """:func:`world` for a command line: None, after printing why on stderr, where MPI is unusable (the
    caller then exits with its bad-input code)."""
    try:
        return world()
    except DeviceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


class RankError(RuntimeError):
    """A set-up step failed on some rank; raised on every rank with the same message."""


def _first_line(exc):
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def agree(comm, fn, *args, **kwargs):
    """Run ``fn`` on every rank; if it raised anywhere, raise on all ranks.

    Returns ``fn``'s result. The error raised is of the failing rank's class
    when that is :class:`InputError` or :class:`DeviceError` (so the CLI maps
    it to exit code 2), otherwise :class:`RankError`; its message names the
    rank unless every rank failed alike.
    """
    result, failure = None, None
    try:
        result = fn(*args, **kwargs)
    except MemoryError:
        failure = ("DeviceError", "out of host memory", None)
    except Exception as exc:  # every rank must learn about any failure
        source = getattr(exc, "source", None)  # an InputError's file or option, kept apart from the problem
        failure = (type(exc).__name__, _first_line(exc) if source is None else exc.problem, source)
    failures = comm.allgather(failure)
    failed = [(r, f) for r, f in enumerate(failures) if f is not None]
    if not failed:
        return result
    first_rank, (name, message, source) = failed[0]
    if len(failed) < comm.Get_size() or len(set(f for _, f in failed)) > 1:
        message, source = f"rank {first_rank}: {message if source is None else f'{source}: {message}'}", None
    known = {"InputError": InputError, "DeviceError": DeviceError}
    if name == "InputError":
        error = InputError(message, source)
    else:
        error = known[name](message) if name in known else RankError(f"{name}: {message}")
    error.agreed = True  # raised on every rank: see abort_on_error
    raise error


def abort(comm, message, code=1):
    """Print ``error: rank R: message`` and end the whole job with ``MPI_Abort(code)``."""
    print(f"error: rank {comm.Get_rank()}: {message}", file=sys.stderr, flush=True)
    # Launchers may end the job before forwarding what a rank wrote just before MPI_Abort (seen
    # once in CI with MPICH's mpiexec: the line was lost); a short pause lets it through.
    time.sleep(ABORT_GRACE_SECONDS)
    comm.Abort(code)
    os._exit(code)  # MPI_Abort may return before the launcher kills this process


@contextlib.contextmanager
def abort_on_error(comm, code=1):
    """Turn an exception on one rank into ``MPI_Abort`` of the whole job.

    Errors raised by :func:`agree` pass through: every rank has them, and a
    normal exit follows. A SIGINT or SIGTERM (:class:`~solvers.interrupts.Interrupted`,
    raised once the files being written have been finished or abandoned)
    aborts with ``128 + signal``, so that no other rank is left waiting.
    """
    try:
        yield
    except Interrupted as exc:
        abort(comm, str(exc), exc.exit_code)
    except Exception as exc:
        if getattr(exc, "agreed", False):
            raise
        abort(comm, f"{type(exc).__name__}: {_first_line(exc)}", code)


class Timer:
    """Accumulate the seconds spent inside ``with timer:`` blocks."""

    def __init__(self):
        self.seconds = 0.0

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds += time.perf_counter() - self._t0


class HostComm:
    """Allreduce and halo exchange on NumPy buffers, with the time spent in MPI.

    Parameters
    ----------
    comm : mpi4py communicator
    plan : HaloPlan
        Which entries go to and come from which rank (built once by the partition).
    """

    def __init__(self, comm, plan):
        self.comm = comm
        self.plan = plan
        self.timer = Timer()
        self._requests = []

    def allreduce(self, values):
        """Sum a small float64 array over ranks (one MPI_Allreduce)."""
        from mpi4py import MPI
        out = np.empty_like(values)
        with self.timer:
            self.comm.Allreduce(values, out, op=MPI.SUM)
        watchdog.beat()
        return out

    def dot(self, u, v):
        """Global ``u . v``."""
        return float(self.allreduce(np.array([np.dot(u, v)], dtype=np.float64))[0])

    def start_halo(self, x_local, halo):
        """Post the receives into ``halo`` and the sends of ``x_local``'s boundary entries."""
        p = self.plan
        with self.timer:
            send = x_local[p.send_index]
            self._requests = [self.comm.Irecv(halo[p.recv_offsets[i]:p.recv_offsets[i + 1]], source=r, tag=7)
                              for i, r in enumerate(p.recv_ranks)]
            self._requests += [self.comm.Isend(send[p.send_offsets[i]:p.send_offsets[i + 1]], dest=r, tag=7)
                               for i, r in enumerate(p.send_ranks)]
            self._send_buffer = send  # alive until the sends complete

    def finish_halo(self):
        """Wait for the exchange started by :meth:`start_halo`."""
        from mpi4py import MPI
        with self.timer:
            MPI.Request.Waitall(self._requests)
        self._requests = []
        watchdog.beat()


class DeviceComm:
    """NCCL on device buffers: allreduce of float64 sums and the grouped halo exchange.

    Every call only enqueues work on the given CuPy stream. Two NCCL
    communicators join the same ranks, one for the allreduces and one for the
    halo exchange: operations of one communicator run one after the other, so
    with two an exchange on one stream runs while an allreduce runs on
    another. Created collectively: rank 0 makes the NCCL ids and MPI
    broadcasts them. Solvers take theirs from :meth:`shared`.
    """

    # One per MPI communicator and GPU, kept for the life of the process: destroying an NCCL
    # communicator waits for its peers to destroy theirs, so one freed by the garbage collector
    # (at a moment that differs between ranks) would hang the job.
    _shared = {}

    @classmethod
    def shared(cls, comm):
        """The process's :class:`DeviceComm` over ``comm`` on the current GPU (made collectively once)."""
        from cupy.cuda import runtime
        key = (comm.py2f(), runtime.getDevice())
        if key not in cls._shared:
            cls._shared[key] = cls(comm)
        return cls._shared[key]

    def __init__(self, comm):
        from cupy.cuda import nccl
        self._nccl = nccl
        rank, size = comm.Get_rank(), comm.Get_size()
        ids = comm.bcast([nccl.get_unique_id() for _ in range(2)] if rank == 0 else None, root=0)
        self.comm, self.halo_comm = (nccl.NcclCommunicator(size, uid, rank) for uid in ids)

    def allreduce(self, send, recv, count, stream):
        """``recv[:count] = sum over ranks of send[:count]`` (CuPy float64 arrays)."""
        nccl = self._nccl
        self.comm.allReduce(send.data.ptr, recv.data.ptr, count, nccl.NCCL_FLOAT64, nccl.NCCL_SUM, stream.ptr)
        # Enqueued, not done: the host runs at most a status read ahead of its peers, so a rank
        # that stops holds the others in that read, and the beats stop there.
        watchdog.beat()

    def transfers(self, plan, sendbuf, halo):
        """The point-to-point calls of one halo exchange, worked out once: ``(sends, receives)``."""
        dtype = {8: self._nccl.NCCL_FLOAT64, 4: self._nccl.NCCL_FLOAT32}[sendbuf.itemsize]
        size = sendbuf.itemsize

        def calls(base, ranks, offsets):
            return [(base + int(offsets[i]) * size, int(offsets[i + 1] - offsets[i]), dtype, peer)
                    for i, peer in enumerate(ranks)]

        return (calls(sendbuf.data.ptr, plan.send_ranks, plan.send_offsets),
                calls(halo.data.ptr, plan.recv_ranks, plan.recv_offsets))

    def exchange(self, transfers, stream):
        """The ``transfers`` as one NCCL group of sends and receives on ``stream``."""
        sends, receives = transfers
        self._nccl.groupStart()
        try:
            for ptr, size, dtype, peer in sends:
                self.halo_comm.send(ptr, size, dtype, peer, stream.ptr)
            for ptr, size, dtype, peer in receives:
                self.halo_comm.recv(ptr, size, dtype, peer, stream.ptr)
        finally:
            self._nccl.groupEnd()
        watchdog.beat()
