"""SIGINT and SIGTERM in the command-line tools: stop cleanly, leave no half-written file.

Inside :func:`handled` the two signals raise :class:`Interrupted` in the main
thread, so ``with`` blocks unwind (an output being written is abandoned, its
temporary file removed) and the CLI prints one line and exits with
``128 + signal number`` (130 for SIGINT, 143 for SIGTERM), as shells expect.
Code that must not be cut in two (the rename that publishes a finished file)
runs inside :func:`deferred`: a signal arriving there is acted on right after.
After the first signal, further ones are ignored so that the clean-up itself
cannot be interrupted.
"""
import contextlib
import functools
import os
import signal
import sys
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """The run was stopped by a signal (a BaseException: ``except Exception`` lets it pass).

    Attributes
    ----------
    signum : int
    exit_code : int
        ``128 + signum``.
    """

    def __init__(self, signum):
        self.signum = int(signum)
        self.exit_code = 128 + self.signum
        super().__init__(f"interrupted by {signal.Signals(self.signum).name}")


class _State:
    active = False      # handlers installed by `handled`
    deferring = 0       # depth of `deferred` sections
    pending = None      # signal received inside a deferred section
    held = False        # signals held from the handlers' installation until `release`
    raised = False      # Interrupted raised once already


def _handler(signum, frame):
    if _State.raised:
        return  # clean-up after the first signal runs to its end
    if _State.deferring:
        _State.pending = signum
        return
    _State.raised = True
    raise Interrupted(signum)


@contextlib.contextmanager
def handled(held=False):
    """Turn SIGINT and SIGTERM into :class:`Interrupted` while the block runs (main thread only).

    Elsewhere (another thread, or handlers already installed by an outer
    block) this does nothing. The previous handlers come back at the end.
    With ``held``, a signal is held from the start, as in :func:`deferred`,
    until :func:`release` (a rank of an MPI job can only act on one once it
    can end the whole job).
    """
    if _State.active or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    _State.active, _State.deferring, _State.pending, _State.raised = True, int(held), None, False
    _State.held = held
    try:
        for s in SIGNALS:
            signal.signal(s, _handler)
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _State.active = False


@contextlib.contextmanager
def deferred(act_at_exit=True):
    """Hold SIGINT/SIGTERM while the block runs.

    A signal received meanwhile raises :class:`Interrupted` when the block has
    finished, or (``act_at_exit=False``) stays pending until :func:`act_on_pending`.
    """
    _State.deferring += 1
    try:
        yield
    finally:
        _State.deferring -= 1
    if act_at_exit and not _State.deferring:
        act_on_pending()


def release():
    """End the hold :func:`handled` started with (``held=True``); a signal held meanwhile stays
    pending for :func:`act_on_pending`. Without such a hold this does nothing."""
    if _State.held:
        _State.held = False
        _State.deferring -= 1


def act_on_pending():
    """Raise :class:`Interrupted` for a signal held by :func:`deferred`, if one came."""
    if _State.pending is not None and not _State.raised:
        signum, _State.pending = _State.pending, None
        _State.raised = True
        raise Interrupted(signum)


def exits_cleanly(main=None, *, held=None):
    """Decorate a CLI's ``main``: a signal ends it with one line on stderr and ``128 + signal``.

    A standard output closed by its reader (``| head``) ends it quietly with
    141, as SIGPIPE would; files being written are abandoned as for a signal.

    ``held()``, asked before the handlers are installed, says whether signals
    are held from the start (see :func:`handled`); ``main`` then calls :func:`release`.
    """
    if main is None:
        return functools.partial(exits_cleanly, held=held)

    @functools.wraps(main)
    def run(*args, **kwargs):
        with handled(held=bool(held is not None and held())):
            try:
                return main(*args, **kwargs)
            except Interrupted as exc:
                print(f"error: {exc}", file=sys.stderr, flush=True)
                return exc.exit_code
            except BrokenPipeError:
                # Python would still flush stdout at exit and fail again: point it at /dev/null.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return 128 + signal.SIGPIPE
    return run
