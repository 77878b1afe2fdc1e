"""A watchdog that ends a run which has stopped making progress.

A rank that is stopped (SIGSTOP, a debugger) or hung leaves the others
waiting in a collective forever. The run's main thread calls :func:`beat`
whenever it makes progress: an MPI exchange or reduction completes (CPU
ranks), an NCCL call is enqueued (GPU ranks, whose host waits on the device
at each status read, so a stopped peer stops the beats there), a phase of the
run ends. A daemon thread checks the time since the last beat and, past the
timeout, calls the run's ``on_expire`` (which prints one line and aborts the
MPI job, so the launcher ends every other rank). Blocking MPI and CUDA calls
release the GIL, so the thread runs while the main thread waits in one.
"""
import contextlib
import threading
import time

_current = None


class Watchdog:
    """Call ``on_expire(idle_seconds)`` once when no :meth:`beat` came for ``seconds``.

    Parameters
    ----------
    seconds : float
    on_expire : callable
        Runs on the watchdog thread; it should end the process.
    """

    def __init__(self, seconds, on_expire):
        self.seconds = float(seconds)
        self.on_expire = on_expire
        self._last = time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="graphsolve-watchdog", daemon=True)

    def start(self):
        self._thread.start()
        return self

    def beat(self):
        """Record progress now."""
        self._last = time.monotonic()

    def stop(self):
        self._stopped.set()

    def _watch(self):
        poll = min(1.0, self.seconds / 4)
        while not self._stopped.wait(poll):
            idle = time.monotonic() - self._last
            if idle > self.seconds:
                self.on_expire(idle)
                return


def beat():
    """Tell the active watchdog (if any) that the run made progress."""
    if _current is not None:
        _current.beat()


@contextlib.contextmanager
def watching(seconds, on_expire):
    """Run the block under a :class:`Watchdog` (none when ``seconds`` is None)."""
    global _current
    if seconds is None:
        yield None
        return
    dog = Watchdog(seconds, on_expire).start()
    previous, _current = _current, dog
    try:
        yield dog
    finally:
        _current = previous
        dog.stop()
