"""The commands in the README and docs/ run as written, from the repository's files.

Each line of a fenced ``bash`` block is one command, run by bash in a scratch folder that links
to the repository's top-level entries (so ``examples/...`` and ``scripts/...`` resolve and the
files the commands write stay out of the checkout); the lines of one page run in order, in one
folder, so a page may use a file its earlier command wrote. ``python`` blocks run as scripts.

A line ending in ``# needs: gpu``, ``# needs: mpi``, ``# needs: slurm`` or ``# needs: amg`` (or
several, comma separated) needs what it names; a python block needs what any of its lines names,
and runs under ``mpiexec -n 2`` when that includes mpi. MPI commands run where mpi4py and mpiexec
are installed, amg ones where PyAMG is (the test extra installs it); GPU and Slurm commands are left
to the GPU tests and tests/test_slurm.py. ``python -m pip install``
and ``python -m pytest`` steps are checked (an install of this checkout with extras it defines; the
test command CI runs), not run from inside this test run.
"""
import importlib.util
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
PAGES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
NEEDS = re.compile(r"#\s*needs:\s*([a-z, ]+)$", flags=re.M)
KNOWN_NEEDS = {"gpu", "mpi", "slurm", "amg"}
TIMEOUT = 300


def fenced_blocks(text, language):
    """The bodies of the fenced code blocks of ``language`` in markdown ``text``."""
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.M | re.S)


def needs_of(text):
    """The words of every ``# needs:`` comment ending a line of ``text``."""
    return {word.strip() for found in NEEDS.findall(text) for word in found.split(",")}


def bash_commands(text):
    """``(command, needs)`` for every command line of the bash blocks, continuation lines joined."""
    commands = []
    for block in fenced_blocks(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            commands.append((line, needs_of(line)))
    return commands


def optional_dependencies():
    """The extras pyproject.toml defines (read as text: tomllib is Python >= 3.11)."""
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([A-Za-z0-9_-]+)\s*=", section, flags=re.M))


def check_install(step):
    """``python -m pip install [-e] .[extras]``: this checkout, with extras pyproject defines."""
    args = shlex.split(step)[4:]
    if args[:1] == ["-e"]:
        args = args[1:]
    assert len(args) == 1, f"{step!r}: expected one target"
    m = re.fullmatch(r"\.(?:\[([a-z0-9,-]+)\])?", args[0])
    assert m, f"{step!r} does not install this checkout"
    extras = set(m.group(1).split(",")) if m.group(1) else set()
    assert extras <= optional_dependencies(), f"{step!r}: unknown extras {extras - optional_dependencies()}"


def check_test_command(line):
    """The test command must be the one CI runs, as written."""
    assert line.split("#")[0].strip() in (REPO / ".ci" / "run").read_text(), f"{line!r} is not what .ci/run runs"


def mpi_available():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return shutil.which("mpiexec") is not None


@pytest.fixture
def scratch(tmp_path):
    """A folder that sees the repository's files through links, and keeps what commands write."""
    for entry in REPO.iterdir():
        if not entry.name.startswith("."):
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


def environment(needs):
    bindir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
    if "gpu" not in needs:
        env["GRAPHSOLVE_DISABLE_GPU"] = "1"  # the CPU path, whatever the machine has
    return env


def run(argv, cwd, needs, what):
    proc = subprocess.run(argv, cwd=cwd, env=environment(needs), capture_output=True, text=True,
                          timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{what}\nexit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def runnable(needs):
    """Whether this machine can run a command that needs ``needs``; fails on unknown words."""
    assert needs <= KNOWN_NEEDS, f"unknown needs {needs - KNOWN_NEEDS}"
    if needs & {"gpu", "slurm"}:
        return False
    if "amg" in needs and importlib.util.find_spec("pyamg") is None:  # installed by the test extra, as in CI
        return False
    if "mpi" in needs and not mpi_available():
        if os.environ.get("REQUIRE_MPI") == "1":
            pytest.fail("REQUIRE_MPI=1 but mpi4py or mpiexec is missing")
        return False
    return True


@pytest.mark.parametrize("page", PAGES)
def test_page_commands_run_as_written(page, scratch):
    commands = bash_commands((REPO / page).read_text())
    ran = 0
    for line, needs in commands:
        if not runnable(needs):
            continue
        for step in line.split(" && "):
            if step.startswith("python -m pip install"):
                check_install(step)
            elif step.startswith("python -m pytest"):
                check_test_command(line)
            else:
                run(["bash", "-c", step], scratch, needs, f"{page}: {step}")
                ran += 1
    if page == "README.md":
        assert ran >= 3  # the quick start's solve, the command-line and MD examples at least


@pytest.mark.parametrize("page", [p for p in PAGES if fenced_blocks((REPO / p).read_text(), "python")])
def test_page_python_blocks_run(page, scratch):
    for i, code in enumerate(fenced_blocks((REPO / page).read_text(), "python")):
        needs = needs_of(code)
        if not runnable(needs):
            continue
        script = scratch / f"block_{i}.py"
        script.write_text(code)
        launcher = ["mpiexec", "-n", "2"] if "mpi" in needs else []
        run([*launcher, sys.executable, str(script)], scratch, needs, f"{page}: python block {i}:\n{code}")


def test_needs_markers_are_read():
    commands = dict(bash_commands("```bash\nsbatch x.sbatch   # needs: slurm\nmpiexec -n 2 y  # needs: mpi, gpu\n"
                                  "python -m solvers.pcg \\\n  --example lap2D_5pt_n100\n```\n"))
    assert commands == {"sbatch x.sbatch   # needs: slurm": {"slurm"}, "mpiexec -n 2 y  # needs: mpi, gpu": {"mpi", "gpu"},
                        "python -m solvers.pcg    --example lap2D_5pt_n100": set()}
    assert not runnable({"gpu"}) and not runnable({"slurm"}) and runnable(set())
    assert runnable({"amg"}) == (importlib.util.find_spec("pyamg") is not None)
