"""The bad-input contract the tests check, and the ways they provoke failures.

Bad input: a non-zero exit code, exactly one line on stderr that starts with
``error:`` and names the file or option at fault, no traceback; files either
complete or as they were before, no temporary file left behind.
"""
import os
import pathlib
import resource
import signal
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "data" / "lap2D_5pt_n100.mtx"
SMALL_SPD = ("%%MatrixMarket matrix coordinate real symmetric\n"
             "3 3 5\n1 1 4\n2 1 -1\n2 2 4\n3 2 -1\n3 3 4\n")


def assert_one_line_error(err, *needles):
    """``err`` is one ``error:`` line containing every needle, with no traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert str(needle) in lines[0], (needle, err)


def leftovers(directory):
    """Temporary files an output left behind in ``directory``."""
    return sorted(p.name for p in pathlib.Path(directory).iterdir() if p.name.endswith(".tmp"))


def run_python(args, *, cwd, file_size_limit=None, timeout=120, env=None):
    """``python args...`` in a subprocess, optionally with writes limited to ``file_size_limit`` bytes.

    The limit (``RLIMIT_FSIZE``) makes a write past it fail with EFBIG, as a
    full disk fails with ENOSPC; SIGXFSZ is ignored so the write returns the error.
    """
    def limit():
        if file_size_limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
           **(env or {})}
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit)
