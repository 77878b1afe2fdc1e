"""Shared fixtures: test data location and the GPU marker policy.

GPU tests carry ``@pytest.mark.gpu``. Without a usable GPU they are skipped,
unless ``REQUIRE_GPU=1`` is set, in which case they fail. Tests that need two
GPUs also carry ``@pytest.mark.multigpu``: with one GPU they are skipped, unless
``REQUIRE_MULTI_GPU=1`` is set.
"""
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


def _data_dir():
    """``GRAPHSOLVE_DATA`` when set (another copy of the data), else the copy in ``tests/data``."""
    candidates = [os.environ.get("GRAPHSOLVE_DATA"), REPO / "tests" / "data"]
    for c in candidates:
        if c and (pathlib.Path(c) / "matrices").is_dir():
            return pathlib.Path(c)
    return None


DATA = _data_dir()
MATRICES = DATA / "matrices" if DATA else None
MD_DATA = DATA / "md" if DATA else None


def _gpu_count():
    from solvers.backend import gpu_available

    if not gpu_available():
        return 0
    import cupy
    return cupy.cuda.runtime.getDeviceCount()


def pytest_collection_modifyitems(config, items):
    count = _gpu_count()
    if count == 1 and os.environ.get("REQUIRE_MULTI_GPU") != "1":
        skip = pytest.mark.skip(reason="needs 2 GPUs (REQUIRE_MULTI_GPU=1 makes this a failure)")
        for item in items:
            if "multigpu" in item.keywords:
                item.add_marker(skip)
    if count:
        return
    if os.environ.get("REQUIRE_GPU") == "1":
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(pytest.mark.usefixtures("_gpu_required"))
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cupy():
    """The CuPy module, for tests marked ``gpu``."""
    return pytest.importorskip("cupy")


@pytest.fixture
def _gpu_required():
    pytest.fail("REQUIRE_GPU=1 but no usable GPU (CuPy missing or no device)")


@pytest.fixture(scope="session")
def matrices_dir():
    if MATRICES is None:
        pytest.skip("shared test matrices not found (set GRAPHSOLVE_DATA)")
    return MATRICES


@pytest.fixture(scope="session")
def md_data_dir():
    if MD_DATA is None or not MD_DATA.is_dir():
        pytest.skip("shared MD data not found (set GRAPHSOLVE_DATA)")
    return MD_DATA
