"""Options shared by the command lines."""
from . import DISTRIBUTION, __version__


def add_version_option(parser):
    """Add ``--version``: the program, the distribution name and its version."""
    parser.add_argument("--version", action="version", version=f"%(prog)s ({DISTRIBUTION} {__version__})",
                        help="print the version and exit")
