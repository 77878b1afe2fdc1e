"""One MD simulation on two GPUs, launched with ``mpirun``/``mpiexec -n 2``.

Needs a machine with 2 GPUs; the ``gpu`` and ``multigpu`` markers skip these
tests elsewhere (see ``tests/conftest.py``).
"""
import re

import pytest

from test_dist import run_mpi
from test_md_parallel import rows

pytestmark = [pytest.mark.gpu, pytest.mark.mpi, pytest.mark.multigpu]


def test_two_gpu_suite():
    proc = run_mpi(2, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", "tests/test_md_gpu_mpi.py", timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "passed" in proc.stdout


def test_cli_on_two_gpus_matches_one(tmp_path):
    base = ["-m", "solvers.md", "--cells", "16", "16", "16", "--steps", "200", "--thermo", "50", "--device", "gpu",
            "--precision", "double"]
    one = run_mpi(1, *base, timeout=300)
    two = run_mpi(2, *base, "--restart", tmp_path / "r.npz", "--dump", tmp_path / "t.xyz", "--dump-every", "100",
                  timeout=300)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    assert two.stdout.count("Loop time of") == 1 and "on 2 procs" in two.stdout
    assert re.search(r"device gpu \(mode graph segments \+ NCCL", two.stdout)
    a, b = rows(one.stdout), rows(two.stdout)
    assert sorted(a) == sorted(b) == [0, 50, 100, 150, 200]
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-8)
    assert (tmp_path / "t.xyz").read_text().count("Lattice=") == 3
