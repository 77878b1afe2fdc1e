"""Where a benchmark result comes from: the commit it was measured at, and when its run began (shared by the
bench and probe scripts)."""
import datetime
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from solvers.outfiles import AtomicFile  # noqa: E402

# the run's start: every file a run saves (a table rewritten after each problem) bears the same stamp,
# and two runs on one commit do not overwrite each other's (to the second: runs follow each other within
# a minute on the GPU machine)
_STARTED = datetime.datetime.now(datetime.timezone.utc)


def stamp():
    """The run's start, UTC, as ``YYYY-MM-DD_HHMMSS`` (in results files' names and titles)."""
    return _STARTED.strftime("%Y-%m-%d_%H%M%S")


def commit():
    """Short commit id: ``GRAPHSOLVE_COMMIT`` (for a copied tree without git history), else git, else "unknown"."""
    named = os.environ.get("GRAPHSOLVE_COMMIT")
    if named:
        return named
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def save(folder, name, text):
    """Write a results file ``folder/name`` whole or not at all (the folder made if missing); returns its path."""
    path = pathlib.Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with AtomicFile(path, "results file", text=True) as out:
        out.write(text)
    return path
