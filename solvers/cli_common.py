"""Options shared by the command lines, and their checks.

``argparse`` reads ``--rtol nan`` or ``--dt inf`` as floats without complaint;
a non-finite value is bad input, refused here in one line naming the option.
"""
import math
import os

from . import DISTRIBUTION, __version__
from .errors import InputError


def add_version_option(parser):
    """Add ``--version``: the program, the distribution name and its version."""
    parser.add_argument("--version", action="version", version=f"%(prog)s ({DISTRIBUTION} {__version__})",
                        help="print the version and exit")


#: Environment variable giving the distributed runs' watchdog timeout when ``--timeout`` is not given.
TIMEOUT_ENV = "GRAPHSOLVE_TIMEOUT"


def option_name(dest):
    """``--t-target`` for the argparse destination ``t_target``."""
    return "--" + dest.replace("_", "-")


def check_finite(args, names):
    """Raise :class:`InputError` when one of the float options ``names`` is NaN or infinite."""
    for name in names:
        value = getattr(args, name)
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if v is not None and not math.isfinite(v):
                raise InputError(f"must be a finite number, got {v}", option_name(name))


def add_timeout_option(parser):
    """Add ``--timeout SECONDS`` (the watchdog of distributed runs) to ``parser``."""
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="under an MPI launcher: abort the whole job when a rank has made no progress for "
                             f"this long (a stopped or hung rank); default ${TIMEOUT_ENV}, else no watchdog")


def timeout_seconds(args, env=None):
    """The watchdog timeout in seconds from ``--timeout`` or the environment, or None for no watchdog."""
    env = os.environ if env is None else env
    value, source = args.timeout, "--timeout"
    if value is None:
        text = env.get(TIMEOUT_ENV, "").strip()
        if not text:
            return None
        source = TIMEOUT_ENV
        try:
            value = float(text)
        except ValueError:
            raise InputError(f"must be a number of seconds, got {text!r}", source) from None
    if not (math.isfinite(value) and value > 0):
        raise InputError(f"must be a finite number of seconds > 0, got {value}", source)
    return value
