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


def save(folder, name, text):
    """Write a results file ``folder/name`` (the folder made if missing); returns its path."""
    path = pathlib.Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
