"""Every kernel program compiles (nvcc, no GPU needed): the generated structs, formats and variants fit.

The text is what the loader hands NVRTC on the GPU (``solvers.kernels.program``);
nvcc compiles it here for Hopper, so a syntax or type error, or a struct whose
host and device layouts differ (the generated ``static_assert``s), fails on any
machine with the CUDA toolkit. Skipped where nvcc is not installed.
"""
import shutil
import subprocess

import numpy as np
import pytest

from solvers import kernels
from solvers.formats import choose_format
from solvers.gallery import periodic_poisson, poisson, power_law_laplacian

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not installed")


def compile_ok(text, tmp_path):
    source = tmp_path / "program.cu"
    source.write_text(text)
    proc = subprocess.run([NVCC, "-arch=sm_90", "-std=c++17", "-c", "-o", str(tmp_path / "program.o"),
                           str(source)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]


def layout(fmt):
    """A layout in format ``fmt``; "dia exceptions": DIA with entries off its diagonals (a torus)."""
    if fmt == "dia exceptions":
        A, fmt = periodic_poisson((40, 40)), "dia"
    else:
        A = power_law_laplacian(3000, seed=1) if fmt not in ("dia", "ell") else poisson((12, 12))
    return choose_format(A.indptr.astype(np.int32), A.indices.astype(np.int32), np, fmt)


@pytest.mark.parametrize("fmt, real, stored", [("dia", "double", False), ("dia exceptions", "float", True),
                                               ("ell", "double", False), ("ell", "float", True),
                                               ("sell", "double", True), ("sell", "float", False),
                                               ("csr", "double", True)])
def test_pcg_and_distributed_kernels_compile(fmt, real, stored, tmp_path):
    from solvers.distributed.gpu import dist_struct
    from solvers.pcg.gpu import kernel_program
    matrix_format = layout(fmt)
    program = kernel_program(matrix_format, real, 512, stored, stream_matrix=stored)
    program["structs"] += (dist_struct(matrix_format.struct),)
    compile_ok(kernels.program(**program, extra=("dist",)), tmp_path)


@pytest.mark.parametrize("real", ["double", "float"])
@pytest.mark.parametrize("pair", ["PairLJ", "PairMorse"])
def test_md_kernels_compile(real, pair, tmp_path):
    from solvers.md.gpu import kernel_program
    compile_ok(kernels.program(**kernel_program(real, pair)), tmp_path)


def test_a_layout_mismatch_fails_to_compile(tmp_path):
    from solvers.kernels.structs import Struct
    s = Struct("Triple", [("a", "int"), ("b", "int"), ("c", "double")])
    text = s.definition().replace("int b;", "double b;")  # what a hand-written mirror drifting would do
    source = tmp_path / "bad.cu"
    source.write_text(text + "__global__ void k(Triple t) {}\n")
    proc = subprocess.run([NVCC, "-arch=sm_90", "-std=c++17", "-c", "-o", str(tmp_path / "bad.o"), str(source)],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "host and device" in proc.stderr


def test_sell_layout_kernel_compiles(tmp_path):
    from solvers.formats.sell import LAYOUT_PROGRAM
    compile_ok(kernels.program("sell_layout", **LAYOUT_PROGRAM), tmp_path)


def test_shared_layout_kernels_compile(tmp_path):
    from solvers.formats.base import LAYOUT_STRUCTS
    compile_ok(kernels.program("layout", structs=LAYOUT_STRUCTS), tmp_path)


def test_amg_setup_kernels_compile(tmp_path):
    compile_ok(kernels.program("amg_setup"), tmp_path)


@pytest.mark.parametrize("real", ["double", "float"])
@pytest.mark.parametrize("rows, latency", [(64, False), (1024, False), (5000, False), (4096, True), (60_000, True)])
def test_onchip_kernels_compile(real, rows, latency, tmp_path):
    from solvers.pcg.onchip import VARIANTS, Layout, candidate_shapes, held_entries, kernel_program
    for variant in VARIANTS if latency else ("classic",):  # batches run classic PCG
        # one system of 60,000 rows spreads over several clusters in single-reduction PCG
        for shape in candidate_shapes(rows, latency, spread=variant != "classic")[:2]:
            # rows of 5 entries, held in registers as one system's layout would
            held = held_entries(shape, variant, 8 if real == "double" else 4, 5) if latency else 0
            layout = Layout(shape, held, 32 * (5 - held), 0, zp_registers=not latency and shape.team == 1)
            compile_ok(kernels.program(**kernel_program(layout, variant, real, 2)), tmp_path)


@pytest.mark.parametrize("fmt, real", [("dia", "float"), ("ell", "double"), ("sell", "float"), ("csr", "double")])
def test_split_pcg_kernels_compile(fmt, real, tmp_path):
    from solvers.pcg.gpu import kernel_program
    compile_ok(kernels.program(**kernel_program(layout(fmt), real, 512, False, split=True)), tmp_path)


@pytest.mark.parametrize("real, outer", [("double", "double"), ("float", "double"), ("float", "float")])
def test_preconditioner_kernels_compile(real, outer, tmp_path):
    compile_ok(kernels.program("precond_pointwise", real, defines=(("outer_t", outer),)), tmp_path)
    for fmt in ("dia", "dia exceptions", "ell", "sell", "csr"):
        matrix_format = layout(fmt)
        compile_ok(kernels.program("precond", real, defines=tuple(matrix_format.defines) + (("outer_t", outer),),
                                   before=("matrix", *matrix_format.kernel_files),
                                   structs=(matrix_format.struct,)), tmp_path)


@pytest.mark.parametrize("real", ["double", "float"])
@pytest.mark.parametrize("columns, ell_width", [(16, 5), (3, None), (1, 7), (256, None)])
def test_multiple_right_hand_side_kernels_compile(real, columns, ell_width, tmp_path):
    from solvers.pcg.multirhs import kernel_program
    compile_ok(kernels.program(**kernel_program(real, columns, ell_width)), tmp_path)
