"""Where a benchmark result comes from: the commit it was measured at (shared by the bench scripts)."""
import os
import pathlib
import subprocess

REPO = pathlib.Path(__file__).resolve().parent.parent


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
