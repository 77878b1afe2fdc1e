"""The wheel: its distribution name, licence, import names and the data the commands need."""
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

import solvers
from solvers.bundled import EXAMPLE_MATRICES, example_matrix

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """Build the wheel from a copy of the files the build reads (the checkout stays untouched)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    for name in ("solvers", "kernels", "examples"):
        shutil.copytree(REPO / name, src / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = out.glob("*.whl")
    return path


def _files(wheel):
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def _metadata(wheel):
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [f for f in zf.namelist() if f.endswith(".dist-info/METADATA")]
        return zf.read(meta).decode()


def test_wheel_claims_only_the_solvers_import_name(wheel):
    files = _files(wheel)
    top = {f.split("/")[0] for f in files if not f.split("/")[0].endswith(".dist-info")}
    assert top == {"solvers"}
    assert "solvers/distributed/__init__.py" in files and not any(f.startswith("solvers/dist/") for f in files)


def test_wheel_ships_kernels_example_data_and_licence(wheel):
    files = _files(wheel)
    assert wheel.name.startswith(f"{solvers.DISTRIBUTION.replace('-', '_')}-{solvers.__version__}-")
    for cu in (REPO / "kernels").glob("*.cu"):
        assert f"solvers/kernels/{cu.name}" in files
    for example in EXAMPLE_MATRICES:
        assert f"solvers/data/{example}.mtx" in files
    assert any(f.endswith(".dist-info/licenses/LICENSE") for f in files)


def test_wheel_metadata_names_the_distribution_and_spdx_licence(wheel):
    meta = _metadata(wheel)
    assert f"\nName: {solvers.DISTRIBUTION}\n" in meta and f"\nVersion: {solvers.__version__}\n" in meta
    assert "\nLicense-Expression: BSD-3-Clause\n" in meta


def test_example_matrix_resolves_inside_the_package():
    for name in EXAMPLE_MATRICES:
        path = example_matrix(name)
        assert path.parent.name == "data" and path.parent.parent == pathlib.Path(solvers.__file__).resolve().parent
        assert path.read_text().startswith("%%MatrixMarket")
