"""Live iteration count and residual norm on a stream, for the command line's ``--progress``.

On a terminal a tqdm line is redrawn in place; anywhere else (a log file, a
pipe) plain lines are written, at most one every ``interval`` seconds, so no
carriage returns end up in the file. Either way :meth:`ResidualProgress.close`
shows the final state once the solve has returned.
"""
import sys
import time

from ..errors import InputError


class ResidualProgress:
    """Callable ``(iteration, rnorm)``, the ``progress`` argument of :meth:`solvers.PCG.solve`.

    Parameters
    ----------
    stream : file, optional
        Where to write (default ``sys.stderr``).
    interval : float
        Seconds between plain lines when ``stream`` is not a terminal.
    """

    def __init__(self, stream=None, interval=1.0):
        self._stream = sys.stderr if stream is None else stream
        self._interval = interval
        self._bar = None
        self._last_line = None
        if _is_terminal(self._stream):
            try:
                from tqdm import tqdm
            except ImportError:
                raise InputError("--progress on a terminal needs tqdm (pip install tqdm)") from None
            self._bar = tqdm(desc="PCG", unit="it", file=self._stream, mininterval=0.1, dynamic_ncols=True,
                             bar_format="{desc}: {n_fmt} iterations, {elapsed}, {rate_fmt}{postfix}")

    def __call__(self, iteration, rnorm):
        if self._bar is not None:
            self._bar.set_postfix_str(f"||r|| = {rnorm:.3e}", refresh=False)
            self._bar.update(iteration - self._bar.n)
            return
        now = time.monotonic()
        if self._last_line is None or now - self._last_line >= self._interval:
            self._last_line = now
            self._write_line(iteration, rnorm)

    def close(self, iteration=None, rnorm=None):
        """Show the final ``iteration`` and ``rnorm`` (when given) and end the display."""
        if self._bar is not None:
            if iteration is not None:
                self._bar.set_postfix_str(f"||r|| = {rnorm:.3e}", refresh=False)
                self._bar.update(iteration - self._bar.n)
            self._bar.close()
        elif iteration is not None:
            self._write_line(iteration, rnorm)

    def _write_line(self, iteration, rnorm):
        print(f"PCG: iteration {iteration:,}  ||r|| = {rnorm:.3e}", file=self._stream, flush=True)


def _is_terminal(stream):
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
