"""CUDA C++ kernels compiled at run time by NVRTC (through ``cupy.RawModule``).

Each ``*.cu`` file here is one family of kernels, templated on the real type;
the matching ``*_ref.py`` module says in NumPy what each kernel computes.
Structs shared with the host are defined once, in Python (:mod:`.structs`), and
generated into the program text. Modules are compiled once per program text and
cached, so callers fetch functions at setup and never compile during graph
capture.
"""
import functools
import os

from .structs import SLOT, definitions

_HERE = os.path.dirname(os.path.abspath(__file__))

# NVRTC does not see cudaGraphSetConditional through cuda_runtime.h; declaring the
# device-runtime entry point is enough (no -rdc, no libcudadevrt).
CONDITIONAL_PRELUDE = (
    'extern "C" __device__ void cudaGraphSetConditional('
    "unsigned long long handle, unsigned int value);\n"
)

_CTYPES = {"float64": "double", "float32": "float"}


def source(name):
    """Text of ``kernels/<name>.cu``."""
    with open(os.path.join(_HERE, f"{name}.cu"), encoding="utf-8") as f:
        return f.read()


def ctype(dtype):
    """C type name for a NumPy dtype (``float64`` -> ``double``)."""
    import numpy as np
    key = np.dtype(dtype).name
    if key not in _CTYPES:
        raise ValueError(f"unsupported dtype {key}; use float64 or float32")
    return _CTYPES[key]


def program(name, real="double", defines=(), extra=(), before=(), structs=()):
    """The text :func:`module` compiles: prelude, ``grid.cu``, ``before``, ``name``, ``extra``.

    Parameters
    ----------
    name : str
        Kernel file stem.
    real : {"double", "float"}
        The floating-point type the kernels are instantiated with (``real_t``).
    defines : sequence of (str, str)
        Preprocessor definitions.
    extra : sequence of str
        Kernel files compiled after ``name`` (they may use its device functions).
    before : sequence of str
        Kernel files compiled before ``name`` (device functions it uses, such as
        a matrix format).
    structs : sequence of structs.Struct
        Structs the kernels use, defined ahead of every file (``Slot`` always is).
    """
    head = [CONDITIONAL_PRELUDE, f"typedef {real} real_t;\n"]
    head += [f"#define {k} {v}\n" for k, v in defines]
    head.append(definitions((SLOT, *structs)))
    return "".join(head) + "".join(source(part) for part in ("grid", *before, name, *extra))


def module(name, real="double", defines=(), extra=(), before=(), structs=()):
    """Compile :func:`program` (same parameters) with NVRTC, once per distinct text.

    Returns
    -------
    cupy.RawModule
    """
    return _module(source, name, real, tuple(defines), tuple(extra), tuple(before), tuple(structs))


@functools.lru_cache(maxsize=None)
def _module(reader, name, real, defines, extra, before, structs):
    """:func:`module` once per distinct arguments, so that a set-up neither reads the files again nor hashes
    the text (half a millisecond a solver); ``reader`` is the :func:`source` of the moment (a probe that
    replaces it to alter a kernel's text gets that text compiled)."""
    return _compiled(program(name, real, defines, extra, before, structs))


@functools.lru_cache(maxsize=None)
def _compiled(code):
    import cupy

    mod = cupy.RawModule(code=code, options=("--std=c++17",))
    mod.compile()
    return mod


@functools.lru_cache(maxsize=None)
def _device_facts(device_id):
    """``(name, attributes)`` of CUDA device ``device_id``, asked once a process: they do not change, and
    CUDA's properties call, which gives the name, is slow (1.8 ms on the H200, MEASUREMENTS.md); the
    attributes are kept beside it so that every device fact the kernels' set-up reads has one source."""
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(device_id)["name"].decode()
    return name, dict(cupy.cuda.Device(device_id).attributes)


def device_name():
    """The current CUDA device's name."""
    import cupy

    return _device_facts(cupy.cuda.Device().id)[0]


def device_attribute(name):
    """The current CUDA device's attribute ``name`` as CuPy's ``Device.attributes`` spells it
    (``"MultiProcessorCount"``, ``"L2CacheSize"``)."""
    import cupy

    return _device_facts(cupy.cuda.Device().id)[1][name]


def resident_blocks(kernel, block, spare_sms=0, shared_mem=0):
    """How many blocks of ``block`` threads of ``kernel`` the device holds at once.

    A grid of this size runs in one wave: a grid-stride kernel given more blocks
    than fit leaves a second, partly empty wave that finishes late.

    Parameters
    ----------
    kernel : cupy.RawKernel
        A function fetched from a :func:`module`.
    block : int
        Threads per block.
    spare_sms : int
        SMs to leave free, for a kernel that is to run alongside (a wave that
        fills them would make it wait, or be delayed by it).
    shared_mem : int
        Bytes of dynamic shared memory a block is launched with.
    """
    import cupy

    function = kernel.kernel  # the cupy.cuda.function.Function behind the RawKernel
    per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(function.ptr, block, shared_mem)
    return int(per_sm) * max(1, int(device_attribute("MultiProcessorCount")) - spare_sms)


def cooperative(kernel, block, shared_mem=0):
    """Launcher and grid limit for a kernel whose blocks wait for each other (grid barriers).

    ``kernel``, ``block`` and ``shared_mem`` (the dynamic shared memory the grid limit
    allows for) are as for :func:`resident_blocks`.

    Returns
    -------
    launch : callable
        ``launch(grid, args, stream=None, shared_mem=0)``: a cooperative launch (with
        ``shared_mem`` bytes of dynamic shared memory a block), for which the driver
        guarantees (and checks) that all ``grid`` blocks are resident at once; it can be
        captured into a graph like any launch.
    max_blocks : int
        :func:`resident_blocks`.
    """
    function = kernel.kernel

    def launch(grid, args, stream=None, shared_mem=0):
        function((grid,), (block,), args, stream=stream, shared_mem=shared_mem, enable_cooperative_groups=True)

    return launch, resident_blocks(kernel, block, shared_mem=shared_mem)
