"""PCG on one GPU: fixed device buffers, the iteration bodies, and their engine.

Everything is allocated and compiled here at set-up; a solve copies ``b`` (and
``x0``) into the fixed buffers, resets the device state and runs the engine.

Two iteration bodies. With a pointwise preconditioner (none, Jacobi) an iteration
is part of one persistent kernel (:meth:`GPUPCG.launch_run`). With any other, it is classic
PCG split into three plain kernels with the preconditioner's own launches
(:meth:`~.preconditioners.Preconditioner.device_apply`) between the second and the
third (:meth:`GPUPCG.launch_split`, ``kernels/pcg_split.cu``). Each level of a V-cycle
then takes the grid that suits its size, and the kernel boundaries are a small
share of a cycle where AMG pays (on an H200 a diffusion iteration, 40 to 60
launches, takes 340 us at 512^2 and 4.3 ms at 2048^2: MEASUREMENTS.md).
"""
import time

import numpy as np

from .. import kernels
from ..backend import require_cupy
from ..engine import GraphEngine
from ..errors import DeviceError, InputError
from ..formats import choose_format
from ..kernels.pcg_ref import RUNNING
from ..kernels.structs import PROGRESS, SLOT, STATE, Struct
from ..reorder import Reordering, canonical
from .cpu import resolve_variant
from .preconditioners import as_preconditioner, jacobi_inverse_diagonal, make_preconditioner, refuse_unsupported
from .preconditioners.device import DeviceProgram
from .result import Reason

BLOCK = 256  # threads per block of the plain kernels (kernels/pcg.cu)
# Threads an SM of the persistent kernels: they cap its registers (RUN_SM_THREADS in kernels/pcg.cu)
# and its grid, which holds no more blocks an SM than make these even where more would fit. H200, us
# an iteration (single-reduction; blocks an SM x threads a block): random geometric graph 50k rows
# 1 x 512: 10.23, 2 x 512: 11.43, 2 x 256: 11.59, 1 x 1024: 10.54, half the SMs x 1024: 11.51;
# power-law graph 100k rows 1 x 512: 16.18, 2 x 512: 17.55, 2 x 256: 16.43, 5 x 256: 24.17;
# Poisson 256^2 (one row a thread: 128 blocks of 512) 5.89, 1 x 1024 6.33, 2 x 256 7.05
# (scripts/results/probe_grid_latency_2026-11-30_2050_NVIDIA_H200_a5b89d4.md). Holding more threads
# an SM (1024, 2048) was no faster for gather-bound products at large n either
# (scripts/results/probe_formats_sweep_2026-11-30_NVIDIA_H200_af63447.md).
SM_THREADS = 512
GATHERS = ("auto", "formed", "stored")
STAGE_RESERVED = 1024  # shared memory the driver keeps back for each block (compute capability 8.0 and later)
# The most shared memory a block of the classic kernel holds r in (held_rows): 8 rows of 1,024 threads.
# H200, power-law graph of 1M rows, us an iteration with 4 / 8 rows held: 76.4-78.1 / 75.4-77.3; with r
# and the inverse diagonal held (128 KiB) no faster than r alone (MEASUREMENTS.md). The rest stays L1.
HELD_BYTES = 64 * 1024


def dynamic_shared_limit(kernel, blocks_per_sm):
    """Dynamic shared memory a block of ``kernel`` may take where an SM holds ``blocks_per_sm`` of them."""
    per_sm = int(kernels.device_attribute("MaxSharedMemoryPerMultiprocessor")) // blocks_per_sm
    return (min(int(kernels.device_attribute("MaxSharedMemoryPerBlockOptin")), per_sm - STAGE_RESERVED)
            - kernel.shared_size_bytes)


def stage_bytes(matrix_format, grid, block, limit, itemsize):
    """Dynamic shared memory a block of the persistent kernel stages its part of the matrix in: all
    of it where it fits in ``limit`` bytes, else none (``stage_matrix`` in the format's kernel file;
    formats that stage nothing get none).

    A staged product reads no matrix entry from L2, where every grid reduction's acquire would
    otherwise send it again (the SM's L1 is dropped). H200, us an iteration without and with:
    random geometric graph 50k rows 9.89 / 8.83 (single-reduction). Staging part of a matrix
    (each warp its first slices, the shared memory full) was slower: power-law graph 100k rows
    15.42 / 21.64, 1M rows 94.56 / 135.54 (classic); ``scripts/probe_pcg_phases.py``,
    MEASUREMENTS.md.
    """
    steps = matrix_format.stage_steps(grid * block // 32)
    if not steps:
        return 0
    needed = steps * (block // 32) * 32 * (itemsize + 4)
    return needed if needed <= limit else 0


def held_rows(n, grid, block, limit, itemsize, requested=None):
    """Rows a thread of the classic kernel with a stored gather keeps r of in shared memory (``pcg_run``):
    all of its rows of the pointwise passes where they fit in HELD_BYTES a block (and ``limit``), else none;
    or, ``requested``, at most that many (and as many as fit in ``limit``).

    Holding part of them takes the L1 the gathers use for less than it saves: H200, random geometric
    graph of 2M rows as numbered (15 rows a thread), us an iteration with none / 8 held: 289.8-290.6 /
    294.3-294.4 (MEASUREMENTS.md).
    """
    rows = -(-n // (grid * block))
    if requested is not None:
        return min(rows, requested, limit // (block * itemsize))
    return rows if rows * block * itemsize <= min(HELD_BYTES, limit) else 0


def run_block(n):
    """Threads per block of the persistent kernels for ``n`` rows.

    Small grids want many small blocks (more SMs at work), larger ones fewer big
    blocks (cheaper grid reductions). H200, us per iteration at 32 iterations a
    launch, blocks of 256 / 512 / 1024 threads: 2D Poisson 64^2 5.7 / 6.0 / 7.2
    (single-reduction), 256^2 7.5 / 6.7 / 7.7 (single-reduction), 3D 64^3 15.6 /
    13.8 / 13.2 (classic), 2D 1024^2 55.1 / 53.5 / 47.1 (classic).
    """
    return 256 if n <= 16_384 else 512 if n <= 131_072 else 1024


class Variant:
    """A PCG variant's persistent kernel, the vectors it owns and its argument struct.

    The struct (``ClassicRun`` or ``SingleReductionRun`` in ``kernels/pcg.cu``) is
    generated from :attr:`vectors` and :attr:`scalars`: the matrix, the preconditioner's
    inverse diagonal, the vectors, the solver's state and bookkeeping buffers, then the
    variant's own scalars.
    """

    name = kernel = struct_name = None
    vectors = ()           # device vectors of n entries the kernel reads and writes
    gather_only = {}       # vector: the one gather ("formed" or "stored") under which the kernel uses it
    scalars = ()           # (name, C type) of the variant's own parameters
    zeroed_at_start = ()   # the first directions, zero before the set-up pass
    residual = None        # the vector holding r = b - A x0 before the set-up pass

    @classmethod
    def struct(cls, matrix):
        """The kernel's argument struct over the format's ``Matrix`` struct."""
        fields = [("A", matrix), ("dinv", "const real_t*")] + [(v, "real_t*") for v in cls.vectors]
        fields += [("st", "State*"), ("slots", "Slot*"), ("arrivals", "unsigned int*"), ("epoch", "unsigned int*"),
                   ("history", "double*"), ("progress", "Progress*")]
        return Struct(cls.struct_name, fields + list(cls.scalars))

    @classmethod
    def uses(cls, vector, gather):
        """Whether the persistent kernel reads or writes ``vector`` under ``gather``."""
        return cls.gather_only.get(vector, gather) == gather


class Classic(Variant):
    """Two grid reductions an iteration; p double-buffered (the product forms the new direction).

    With a stored gather z is never stored (the direction pass forms it from r), and each thread
    may keep r of its first ``held`` rows on chip for a launch (``pcg_run``)."""

    name, kernel, struct_name = "classic", "pcg_run", "ClassicRun"
    vectors = ("x", "r", "z", "q", "p0", "p1")
    gather_only = {"z": "formed"}
    scalars = (("held", "int"),)
    zeroed_at_start = ("p0",)
    residual = "r"


class SingleReduction(Variant):
    """Chronopoulos-Gear: one grid reduction an iteration; r, s, w double-buffered; u when stored."""

    name, kernel, struct_name = "single-reduction", "pcg1_run", "SingleReductionRun"
    vectors = ("x", "p", "r0", "r1", "s0", "s1", "w0", "w1", "u")
    gather_only = {"u": "stored"}
    zeroed_at_start = ("p", "s0", "w0")
    residual = "r0"


VARIANTS = {cls.name: cls for cls in (Classic, SingleReduction)}


def split_struct(matrix):
    """``SplitRun`` of ``kernels/pcg_split.cu``: classic PCG's vectors, r in float32 for a float32 preconditioner
    (or null), state and the blocks' partial sums."""
    fields = [("A", matrix)] + [(v, "real_t*") for v in Classic.vectors] + [("r_low", "float*")]
    fields += [("st", "State*"), ("partials", "double*"), ("history", "double*"), ("progress", "Progress*")]
    return Struct("SplitRun", fields)


def kernel_program(matrix_format, real, run_block_size, gather_stored, stream_matrix=False, split=False):
    """Arguments of :func:`kernels.module` for the PCG kernels over ``matrix_format`` (``split``: pcg_split.cu too)."""
    defines = tuple(matrix_format.defines) + (("RUN_BLOCK", str(run_block_size)), ("RUN_SM_THREADS", str(SM_THREADS)),
                                              ("GATHER_STORED", "1" if gather_stored else "0"))
    if stream_matrix:
        defines += (("STREAM_MATRIX", "1"),)
    structs = (STATE, PROGRESS) + tuple(v.struct(matrix_format.struct) for v in VARIANTS.values())
    program = dict(name="pcg", real=real, defines=defines, before=("stopping", "matrix", *matrix_format.kernel_files),
                   structs=structs)
    if split:
        program.update(structs=structs + (split_struct(matrix_format.struct),), extra=("pcg_split",))
    return program


def to_device_csr(A, dtype):
    """Any supported matrix as a canonical cupyx CSR matrix of ``dtype`` (sorted indices, no duplicates), on the
    device."""
    cupy = require_cupy()
    import cupyx.scipy.sparse as csp
    import scipy.sparse as sp

    if csp.issparse(A):
        M = A.tocsr().astype(dtype)
    elif sp.issparse(A):
        M = csp.csr_matrix(sp.csr_matrix(A, dtype=dtype))
    else:
        dense = cupy.asarray(A) if hasattr(A, "__cuda_array_interface__") else None
        if dense is None and hasattr(A, "__dlpack__"):
            dense = cupy.from_dlpack(A)
        if dense is None:
            dense = cupy.asarray(np.asarray(A))
        if dense.ndim != 2:
            raise InputError(f"A must be 2-D, got shape {dense.shape}")
        M = csp.csr_matrix(dense.astype(dtype))
    return canonical(M)


class _HostMapped:
    """A small struct in pinned, device-mapped host memory (written by kernels, read by the host)."""

    def __init__(self, dtype):
        cupy = require_cupy()
        self._mem = cupy.cuda.alloc_pinned_memory(dtype.itemsize)
        self.host = np.frombuffer(self._mem, dtype=dtype, count=1)
        self.host[...] = 0
        # With unified addressing a pinned host pointer is valid on the device as is.
        self.device_ptr = self._mem.ptr


class GPUPCG:
    """Set-up-once PCG on the GPU, driven by :class:`~solvers.engine.GraphEngine`.

    Parameters
    ----------
    A, preconditioner, dtype, mode, unroll, record_history, variant
        As for :class:`~solvers.pcg.solver.PCG` (``preconditioner`` a name or a
        :class:`~solvers.pcg.Preconditioner`, set up here on the device matrix).
    matrix_format : {"auto", "dia", "ell", "sell", "csr"}
        Storage of A (:func:`solvers.formats.choose_format`).
    gather : {"auto", "formed", "stored"}
        How the product reads the vector it multiplies at neighbouring rows
        (``kernels/pcg.cu``): formed on the fly from the vectors it is made of
        (no grid barrier before the product), or stored first (one vector
        gathered). ``auto``: formed for ELL and DIA, whose neighbours sit close in
        memory, stored for the other formats (``MatrixFormat.gather``).
    stream_matrix : bool, optional
        Load the matrix with evict-first hints (``STREAM_MATRIX`` in ``kernels/matrix.cu``);
        by default when the matrix is larger than the L2 cache, so it would not stay
        there anyway (H200, per iteration with and without: 27-point 128^3 219.6 / 224.0
        us, random geometric graph 2M rows 314.6 / 323.7 us).
    sell_lanes : int, optional
        Threads a row of the SELL format (default: :meth:`solvers.formats.SELL.auto_lanes`).
    sell_rows : {"auto", "neighbours", "length"}
        Row order of the SELL format (:class:`solvers.formats.SELL`).
    block : int, optional
        Threads per block of the persistent kernel (default :func:`run_block`).
    reordering : solvers.reorder.Reordering, optional
        The permutation the caller applied to ``A`` (for the preconditioner's set-up).
    renumber : bool
        With a pointwise preconditioner, let SELL number the rows as it lays them out
        (by neighbours, or by length over a scattered numbering:
        :class:`solvers.formats.SELL`): the solver then keeps its
        vectors in that numbering and carries ``b``, ``x0`` and ``x`` across, so
        callers never see it (:attr:`numbering`).
    held : int, optional
        Rows a thread of the classic kernel with a stored gather keeps r of in shared
        memory (``pcg_run``). Default: where nothing of the matrix is staged there, all
        of its rows where they fit in ``HELD_BYTES`` a block (:func:`held_rows`). Given,
        nothing is staged and at most that many are held; refused for the other kernels.

    Attributes
    ----------
    M : Preconditioner or None
        The set-up preconditioner when it is not pointwise (its details and timing).
    numbering : solvers.reorder.Reordering or None
        The format's own numbering of the rows, where it has one.
    """

    device = "gpu"
    default_unroll = 32  # iterations a launch when the caller names none

    def __init__(self, A, preconditioner, dtype, mode, unroll, record_history, variant="auto",
                 matrix_format="auto", gather="auto", stream_matrix=None, sell_lanes=None, block=None,
                 reordering=None, sell_rows="auto", renumber=False, held=None):
        cupy = require_cupy()
        spec = as_preconditioner(preconditioner)
        refuse_unsupported(spec, "gpu", variant, dtype)
        if gather not in GATHERS:
            raise InputError(f"gather must be one of {', '.join(GATHERS)}, not {gather!r}")
        self.cupy = cupy
        self.requested_variant = variant
        self.requested_format = matrix_format
        self.requested_gather = gather
        self.requested_stream = stream_matrix
        self.sell_lanes, self.sell_rows, self.requested_block = sell_lanes, sell_rows, block
        self.renumber = renumber
        self.requested_held = held
        self.dtype = np.dtype(dtype)
        self.spec, self.preconditioner, self.reordering = spec, spec.name, reordering
        self.split = not spec.pointwise
        self.M = None
        self.record_history = record_history
        self.device_name = kernels.device_name()
        try:
            self._setup(A)
        except cupy.cuda.memory.OutOfMemoryError as exc:
            raise DeviceError(f"out of GPU memory while setting up the solver ({exc})") from None
        # The persistent kernel itself runs `unroll` iterations a launch: the engine launches it once a
        # pass. The split body is one iteration: the engine captures `unroll` of them.
        self.unroll = self.iterations_per_launch = int(unroll)
        self.engine = GraphEngine(self.launch_body, mode=mode, unroll=self.unroll if self.split else 1)
        self.mode_note = self.engine.note

    # -- set-up ---------------------------------------------------------------
    def _setup(self, A):
        cupy = self.cupy
        M = to_device_csr(A, self.dtype)
        self.shape = M.shape
        if M.shape[0] != M.shape[1]:
            raise InputError(f"A must be square, got shape {M.shape}")
        n, nnz = M.shape[0], int(M.nnz)
        if n >= 2**31 - 1 or nnz >= 2**31 - 1:
            raise InputError("matrices with 2^31 or more rows or entries are not supported (int32 indices)")
        self.n = n
        self.variant = self._choose_variant(M)
        indptr = cupy.ascontiguousarray(M.indptr.astype(cupy.int32))
        indices = cupy.ascontiguousarray(M.indices.astype(cupy.int32))
        data = M.data.astype(self.dtype)
        self._check_values(data)
        self._pattern = (indptr, indices)
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        # the split body's preconditioner works on A as numbered: only the fused kernels take a numbering
        self.format = choose_format(indptr, indices, cupy, self.requested_format, self.sell_lanes, self.sell_rows,
                                    self.renumber and not self.split)
        self.val = self.format.values(data)
        numbering = self.format.numbering
        self.numbering = (None if numbering is None else
                          Reordering(numbering, "the format's layout", inverse=self.format.places))
        cupy.cuda.Device().synchronize()
        self.format_time = time.perf_counter() - t0
        gather = self.requested_gather
        if gather == "auto":
            gather = self.format.gather
        self.gather = gather
        self.stream_matrix = self.requested_stream
        if self.stream_matrix is None:
            l2 = int(kernels.device_attribute("L2CacheSize"))
            self.stream_matrix = self.val.nbytes + self.format.index_bytes() > l2

        self.run_block = self.requested_block or run_block(n)
        program = kernel_program(self.format, kernels.ctype(self.dtype), self.run_block, gather == "stored",
                                 self.stream_matrix, self.split)
        mod = kernels.module(**program)
        self.k_residual = mod.get_function("matrix_residual")
        self.k_prepare = mod.get_function("solve_prepare")
        if self.split:
            self._split_kernels = [mod.get_function(k) for k in ("split_direction", "split_update", "split_decide")]
            self._split_struct = split_struct(self.format.struct)
            split_capacity = min(kernels.resident_blocks(k, BLOCK) for k in self._split_kernels)
        variant = VARIANTS[self.variant]
        self._variant = variant
        run_kernel = mod.get_function(variant.kernel)
        self._run, capacity = kernels.cooperative(run_kernel, self.run_block)
        self._run_struct = variant.struct(self.format.struct)

        sms = int(kernels.device_attribute("MultiProcessorCount"))
        threads = max(self.format.threads(), n)  # the product's work items, or the rows of the pointwise phases
        # The residual kernel strides over the rows with enough blocks to fill the GPU; the
        # persistent kernel takes its share of the work items up to the blocks the GPU holds at once,
        # and no more than SM_THREADS an SM.
        self.grid_spmv = int(max(1, min(-(-threads // BLOCK), sms * 8)))
        # the split kernels stride over the rows with the blocks the GPU holds at once (no second wave)
        self.grid_split = int(max(1, min(-(-threads // BLOCK), split_capacity))) if self.split else 0
        per_sm = max(1, SM_THREADS // self.run_block)
        self.grid = int(max(1, min(-(-threads // self.run_block), capacity, sms * per_sm)))
        limit = dynamic_shared_limit(run_kernel, -(-self.grid // sms))
        self.stage_bytes = self.held = 0
        if not self.split and self.requested_held is None:
            self.stage_bytes = stage_bytes(self.format, self.grid, self.run_block, limit, self.dtype.itemsize)
        if variant is Classic and gather == "stored" and not self.split and not self.stage_bytes:
            self.held = held_rows(n, self.grid, self.run_block, limit, self.dtype.itemsize, self.requested_held)
        elif self.requested_held:
            raise InputError("r is held on chip only by the classic variant with a stored gather and a pointwise "
                             f"preconditioner, not {self.variant}, gather {gather}, {self.preconditioner}")
        # the dynamic shared memory of a launch: the staged matrix, or r held (pcg_run), never both
        self.shared_bytes = self.stage_bytes or self.held * self.run_block * self.dtype.itemsize
        # the kernel object is shared by every solver compiled from the same program: raise its limit only
        run_kernel.max_dynamic_shared_size_bytes = max(run_kernel.max_dynamic_shared_size_bytes, self.shared_bytes)

        self.vectors = {}
        for name in variant.vectors:
            self.vectors[name] = cupy.zeros(n, dtype=self.dtype) if self._uses(name) else None
        self.x = self.vectors["x"]
        self.r = self.vectors[variant.residual]
        self.b = cupy.zeros(n, dtype=self.dtype)
        self.dinv = cupy.zeros(n, dtype=self.dtype) if self.preconditioner == "jacobi" else None
        # the persistent kernel's reduction slots (two buffers of one a block), its arrival counter and
        # the tag its next launch starts from (kernels/grid.cu): the counter is the tag times the grid
        self.slots = cupy.zeros(2 * self.grid * SLOT.dtype.itemsize, dtype=cupy.uint8)
        self.arrivals = cupy.zeros(1, dtype=cupy.uint32)
        self.epoch = cupy.zeros(1, dtype=cupy.uint32)
        self.state = cupy.zeros(STATE.dtype.itemsize, dtype=cupy.uint8)
        self.progress = _HostMapped(PROGRESS.dtype)
        self.history = None
        self.partials = cupy.zeros(2 * self.grid_split, dtype=cupy.float64) if self.split else None
        self.r_low = None  # r in float32 for a float32 preconditioner inside float64 CG (the update writes it)
        self._set_diagonal(M)
        if self.split:
            self._set_up_preconditioner(M)
        self._pack_args()

    def _uses(self, vector):
        """Whether the kernels set up run with the variant's ``vector`` (allocated only then): the split body
        uses every classic vector, the persistent kernel those of its gather."""
        return self.split or self._variant.uses(vector, self.gather)

    def _choose_variant(self, M):
        """The PCG variant to run on the device CSR matrix ``M``: the one asked for, ``auto`` resolved."""
        return resolve_variant(self.requested_variant, M.shape[0], "gpu", self.spec.variants["gpu"])

    def _set_up_preconditioner(self, M):
        """Set the preconditioner up on the device matrix ``M`` and lay out its launches on z = M^-1 r."""
        self.M = make_preconditioner(self.spec, M, self.reordering)
        self._lay_out_preconditioner(M)

    def _lay_out_preconditioner(self, M):
        """The preconditioner's launches on fixed buffers (uploads what its set-up left on the host); its
        products with the solver's matrix ``M`` reuse the solver's layout of it."""
        cupy = self.cupy
        stop = int(self.state.data.ptr) + STATE.dtype.fields["status"][1]  # the launches skip once it is set
        if np.dtype(self.M.storage_dtype) != self.dtype and self.r_low is None:
            self.r_low = cupy.zeros(self.n, dtype=cupy.float32)
        self.program = DeviceProgram(self.r, self.vectors["z"], self.M.storage_dtype, stop, (M, self.format),
                                     self.r_low)
        self.M.device_apply(self.program)
        self.program.close()
        cupy.cuda.Device().synchronize()

    def _pack_args(self):
        """The kernels' argument structs (fixed addresses, so graphs capture them once)."""
        self._matrix_args = self.format.pack(self.val)
        scalars = {name: getattr(self, name) for name, _ in self._variant.scalars}  # set up as attributes
        self._run_args = self._run_struct.pack(A=self._matrix_args, dinv=self.dinv, st=self.state, slots=self.slots,
                                               arrivals=self.arrivals, epoch=self.epoch, history=self.history,
                                               progress=self.progress.device_ptr, **self.vectors, **scalars)
        if self.split:
            self._split_args = self._split_struct.pack(
                A=self._matrix_args, r_low=self.r_low, st=self.state, partials=self.partials, history=self.history,
                progress=self.progress.device_ptr, **{v: self.vectors[v] for v in Classic.vectors})

    @staticmethod
    def _check_values(val):
        if not bool(val.size) or not bool(require_cupy().isfinite(val).all()):
            raise InputError("A has NaN or Inf entries" if val.size else "A has no nonzero entries")

    def _set_diagonal(self, M):
        if self.dinv is None:
            return
        self.dinv[...] = self._inward(jacobi_inverse_diagonal(M.diagonal().astype(self.dtype)))  # captured address

    @property
    def mode(self):
        return self.engine.mode

    @property
    def instantiations(self):
        return self.engine.instantiations

    def describe(self):
        """What the set-up chose, for reports: format, gather, the matrix loads' cache hint, staging."""
        staged = f", staged ({self.stage_bytes // 1024} KiB a block)" if self.stage_bytes else ""
        if self.held:
            staged = f", r held on chip ({self.held} rows a thread)"
        return f"{self.format.describe()}, gather {self.gather}" + (", streamed" if self.stream_matrix else "") + staged

    def update_values(self, A):
        """New values in place (same pattern: the graph is kept), else a fresh set-up."""
        cupy = self.cupy
        M = to_device_csr(A, self.dtype)
        if M.shape != self.shape:
            raise InputError(f"new matrix has shape {M.shape}, expected {self.shape}")
        indptr, indices = self._pattern
        same = (int(M.nnz) == indices.size and bool(cupy.array_equal(M.indptr, indptr))
                and bool(cupy.array_equal(M.indices, indices)))
        if same:
            data = M.data.astype(self.dtype)
            self._check_values(data)
            self.format.values(data, out=self.val)
            self._set_diagonal(M)
            if self.split:  # new values of the preconditioner's own arrays: its launches are laid out again
                self.M.update_values(M)
                self._lay_out_preconditioner(M)
                self.engine.invalidate()
            return
        self._setup(M)
        self.engine.invalidate()

    # -- solving --------------------------------------------------------------
    def check_vector(self, v, name, columns=None):
        """``v`` as a device vector of the solver's dtype (device inputs are not copied to the host);
        with ``columns``, as a C-contiguous ``(n, columns)`` array."""
        cupy = self.cupy
        if hasattr(v, "__cuda_array_interface__"):
            v = cupy.asarray(v)
        elif hasattr(v, "__dlpack__") and not isinstance(v, np.ndarray):
            try:
                v = cupy.from_dlpack(v)
            except Exception:
                v = np.asarray(v)
        if isinstance(v, np.ndarray) or not isinstance(v, cupy.ndarray):
            v = np.asarray(v)
            if np.iscomplexobj(v) or not np.issubdtype(v.dtype, np.number):
                raise InputError(f"{name} must be real, got dtype {v.dtype}")
        if columns is not None:
            if v.shape != (self.n, columns):
                raise InputError(f"{name} has shape {v.shape}, expected ({self.n}, {columns})")
            return cupy.ascontiguousarray(cupy.asarray(v, dtype=self.dtype))
        if v.ndim == 2 and 1 in v.shape:
            v = v.reshape(-1)
        if v.shape != (self.n,):
            raise InputError(f"{name} has shape {v.shape}, expected ({self.n},)")
        return cupy.asarray(v, dtype=self.dtype)

    def norm(self, v):
        return float(self.cupy.linalg.norm(v))

    def _ensure_history(self, maxiter):
        if not self.record_history:
            return
        if self.history is None or self.history.size < maxiter + 1:
            self.history = self.cupy.zeros(maxiter + 1, dtype=self.cupy.float64)
            self._pack_args()
            self.engine.invalidate()  # the history pointer is baked into the graph

    def _reset_state(self, tol, maxiter):
        self.state.set(np.frombuffer(STATE.pack(tol=tol, maxiter=maxiter, status=RUNNING, iteration=-1).tobytes(),
                                     dtype=np.uint8))  # iteration -1: the set-up pass
        self.progress.host[...] = 0

    def launch_body(self, stream, loop):
        """The engine's body: one iteration of the split body, or one launch of the persistent kernel."""
        if self.split:
            self.launch_split(loop.handle, stream)
        else:
            self.launch_run(self.iterations_per_launch, loop.handle, stream)

    def launch_split(self, handle, stream=None):
        """Enqueue one iteration of the split body (``handle``: the WHILE node's, or 0)."""
        direction, update, decide = self._split_kernels
        grid, args, handle = (self.grid_split,), (self._split_args,), np.uint64(handle)
        direction(grid, (BLOCK,), args + (handle,), stream=stream)
        update(grid, (BLOCK,), args, stream=stream)
        self.program.launch(stream)
        decide(grid, (BLOCK,), args + (handle,), stream=stream)

    def launch_run(self, count, handle, stream=None):
        """Enqueue one launch of the persistent kernel: up to ``count`` iterations (or the set-up pass)."""
        self._run(self.grid, (self._run_args, np.uint64(handle), np.int32(count)), stream=stream,
                  shared_mem=self.shared_bytes)

    def _start(self, tol, maxiter):
        """Reset the device state and run the set-up pass (r holds b - A x0; zero first directions)."""
        for name in self._variant.zeroed_at_start:
            self.vectors[name].fill(0)
        self._reset_state(tol, maxiter)
        if self.split:  # z = M^-1 r and the first decision
            if self.r_low is not None:  # the iterations' update writes it; here r is b - A x0
                self.r_low[...] = self.r
            self.program.launch()
            self._split_kernels[2]((self.grid_split,), (BLOCK,), (self._split_args, np.uint64(0)))
        else:
            self.launch_run(1, np.uint64(0))

    def _residual(self, x, out):
        self.k_residual((self.grid_spmv,), (BLOCK,), (self._matrix_args, x, self.b, out))

    def _prepare_on_device(self, rtol, atol, maxiter):
        """:meth:`_start` decided on the device: the State from ``b`` there, then the set-up pass."""
        for name in self._variant.zeroed_at_start:
            self.vectors[name].fill(0)
        self._device_state(rtol, atol, maxiter)
        self.launch_run(1, 0, self.cupy.cuda.get_current_stream())

    def _device_state(self, rtol, atol, maxiter):
        """A fresh solve's State, its tolerance from ``b`` on the device (``solve_prepare``)."""
        self.k_prepare((1,), (1024,), (self.state, np.uint64(self.progress.device_ptr), self.b, np.int32(self.n),
                                       np.float64(rtol), np.float64(atol), np.int32(maxiter)))  # PREPARE_BLOCK

    def _inward(self, v, out=None):
        """A vector as the caller numbers it, in the solver's numbering (into ``out`` when given)."""
        return self._carried(v, "perm", out, copy=False)

    def _outward(self, v, out=None):
        """A vector in the solver's numbering, as the caller numbers it (a new array unless ``out``)."""
        return self._carried(v, "inverse", out, copy=True)

    def _carried(self, v, which, out, copy):
        """``v`` gathered by :attr:`numbering`'s ``which`` index where the solver has a numbering of its own,
        else ``v`` itself (or a copy); into ``out`` when given (no allocation: stream capture can hold it)."""
        if self.numbering is not None:
            return self.cupy.take(v, getattr(self.numbering, which), out=out)
        if out is None:
            return v.copy() if copy else v
        out[...] = v
        return out

    def _load(self, b, x0):
        """b, x (x0 or zero) and r = b - A x into the fixed buffers, in the solver's numbering, on the current
        stream."""
        self._inward(b, self.b)
        if x0 is None:
            self.x.fill(0)
            self.r[...] = self.b
        else:
            self._inward(x0, self.x)
            self._residual(self.x, self.r)

    def enqueue(self, b, out, x0, rtol, atol, maxiter):
        """Enqueue a whole solve on the current stream, reading and writing only device memory:
        no allocation, no host synchronisation, so a caller's stream capture can hold it.
        ``b``, ``out`` and ``x0`` are device vectors of the solver's dtype; the result stays in the
        State (:meth:`enqueued_result`)."""
        stream = self.cupy.cuda.get_current_stream()
        self._load(b, x0)
        self._prepare_on_device(rtol, atol, maxiter)
        self.launch_run(2**31 - 1, 0, stream)  # to the stop: the kernel ends at the State's maxiter
        self._outward(self.x, out)

    def enqueued_result(self):
        """``(reason, iterations, rnorm, tol)`` of the last enqueued solve (reads the device State)."""
        st = STATE.read(self.state.get())
        return Reason(int(st["status"])), int(st["iteration"]), float(st["rnorm"]), float(st["tol"])

    def solve(self, b, x0, tol, maxiter, callback, record_history, on_progress=None):
        """Return ``(x, reason, iterations, rnorm, history)``; ``x`` is a new CuPy array.

        ``on_progress(iteration, rnorm)`` is called about ten times a second while
        the device runs, from host-mapped memory the decide step writes.
        """
        cupy = self.cupy
        if maxiter >= 2**31 - 1:
            raise InputError("maxiter must be below 2^31")
        self._ensure_history(maxiter)
        self._load(b, x0)
        self._start(tol, maxiter)
        cupy.cuda.Device().synchronize()
        prog = self.progress.host
        seen = [0]

        def done():
            if callback is None:  # the progress word is exact once the device loop has stopped
                return int(prog["status"][0]) != RUNNING
            st = STATE.read(self.state.get())  # exact every iteration, for the callback
            if int(st["iteration"]) > seen[0]:
                seen[0] = int(st["iteration"])
                callback(self.x if self.numbering is None else self._outward(self.x))
            return int(st["status"]) != RUNNING

        def on_wait():
            on_progress(int(prog["iteration"][0]), float(prog["rnorm"][0]))

        # A callback must see every iteration: one iteration a launch, plain launches, a host check each.
        self.iterations_per_launch = 1 if callback is not None else self.unroll
        # eager split bodies: one iteration a launch, the host checks once per `unroll` of them
        check_every = self.unroll if self.split and callback is None else 1
        t0 = time.perf_counter()
        try:
            self.engine.run(done, max(maxiter, 1), eager=callback is not None, check_every=check_every,
                            on_wait=on_wait if on_progress is not None else None)
        finally:
            self.iterations_per_launch = self.unroll
        self.last_capture_time = self.engine.build_time
        self.last_loop_time = time.perf_counter() - t0 - self.last_capture_time
        st = STATE.read(self.state.get())
        reason = Reason(int(st["status"]))
        if reason is Reason.RUNNING:
            raise RuntimeError("device loop ended without a stop reason (engine bound reached)")
        its = int(st["iteration"])
        history = self.history[: its + 1].get() if self.record_history else None
        return self._outward(self.x), reason, its, float(st["rnorm"]), history

    def true_residual_norm(self, b, x):
        w = self.cupy.empty_like(self.r)
        self._residual(self._inward(x), w)
        return float(self.cupy.linalg.norm(w))
