"""PCG on chip (``kernels/onchip.cu``): each system solved inside one thread block or one cluster.

:class:`OnChipKernel` sizes, compiles and launches the kernel over stacked systems
(a block-diagonal CSR matrix); :class:`~solvers.pcg.batched.BatchedPCG` runs it
over many systems and :class:`OnChipPCG` over one, as PCG's small-system path.
"""
import dataclasses

import numpy as np

from .. import kernels
from ..backend import array_module
from ..errors import DeviceError, InputError
from ..formats.base import entry_rows
from ..kernels.structs import PROGRESS, STATE, Struct
from .gpu import GPUPCG, to_device_csr

# The kernel's argument struct: stacked CSR, per-row vectors, per-system state and norms.
ONCHIP_RUN = Struct("OnchipRun", [
    ("rowptr", "const int*"), ("col", "const int*"), ("val", "const real_t*"), ("dinv", "const real_t*"),
    ("start", "const int*"), ("b", "const real_t*"), ("x", "real_t*"), ("r", "real_t*"), ("z", "real_t*"),
    ("p", "real_t*"), ("s", "real_t*"), ("w", "real_t*"), ("st", "State*"), ("norms", "double*"),
    ("history", "double*"), ("progress", "Progress*"), ("sell_val", "real_t*"), ("sell_col", "int*"),
    ("mirror", "real_t*"), ("group_sums", "double*"), ("group_arrivals", "unsigned long long*"),
    ("order", "const int*"), ("slot", "const int*"), ("rtol", "double"), ("atol", "double"), ("maxiter", "int"),
    ("systems", "int"), ("count", "int"), ("fresh", "int"), ("matrix_capacity", "int"), ("matrix_shared", "int")])

MAX_TEAM = 16          # blocks a system: the largest cluster (above 8 a non-portable size)
PORTABLE_TEAM = 8
MAX_ROWS = 8           # rows a thread keeps in registers
ONE_ROW_BLOCK = 640    # the largest block of latency_shape's one row a thread (the largest measured: lap2D_5pt_n100)
# Clusters of MAX_TEAM blocks (one an SM) an H200 holds at once (cuOccupancyMaxActiveClusters,
# scripts/probe_multicluster.py): the most teams one system spreads over (spread_shape).
MAX_GROUPS = 7
# Shared memory a block may use (H200: 227 KiB), less a margin for alignment.
SHARED_LIMIT = 227 * 1024 - 256
SM_SHARED = 228 * 1024  # shared memory of an SM
QUARTER_REGISTERS = 16384  # 32-bit registers of each of an SM's four schedulers (a warp stays on one)
THREAD_REGISTERS = 255     # the most one thread may use
# Registers a thread needs besides its rows' vectors and held matrix entries (indices, scalars, the
# slices' addresses): a base by variant and whether the system spans a cluster (reads from other
# blocks), and REGISTERS_A_ROW more for each of its rows; the most that leaves ptxas (CUDA 13,
# sm_90) no spills on the layouts of latency_shape up to 16,384 rows.
RESERVED_REGISTERS = {("classic", False): 40, ("classic", True): 64,
                      ("single-reduction", False): 46, ("single-reduction", True): 62}
REGISTERS_A_ROW = 6
TEAM_SUMS = 3  # values one reduction of the kernel adds at most (r.r, r.u, w.u)
MIRROR_VECTORS = 6  # a system over several clusters: r, s and w of two iterations in global memory
# Registers more for a system over several clusters (the mirror's addresses; Poisson 256^2 spilled
# holding 4).
SPREAD_REGISTERS = 8
NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14  # CUfunction_attribute
VARIANTS = ("classic", "single-reduction")


PATHS = ("auto", "grid", "on-chip")
# auto takes the on-chip path up to this many rows. H200, float64, Jacobi, auto's variant, us per
# iteration on chip / on the grid (scripts/results/small_2026-12-01_0021_*, layouts of latency_shape):
# gr_900 1.74 / 6.28, 1138_bus 2.44 / 5.24, Poisson 64^2 1.88 / 5.09, lap2D_5pt_n100 2.20 / 5.28,
# Poisson 128^2 2.69 / 5.18; above, Poisson 256^2 10.9 / 5.86.
ONCHIP_MAX_ROWS = 16384
# Above, up to this many rows, single-reduction PCG spreads a system over several clusters (spread_shape).
SPREAD_MAX_ROWS = MAX_GROUPS * MAX_TEAM * ONE_ROW_BLOCK
# ... and only while nearly all of a cluster's product reads stay in the reading block: Poisson 64^2
# (10% of its entries read from another block of the cluster) and 128^2 (5%) run 2x faster on chip than
# on the grid; the 3-D geometric graph of 50,000 rows was 18x slower numbered at random (86%) and 4.7x
# slower in RCM order (19%; there with most of its matrix in global memory).
ONCHIP_MAX_REMOTE = 0.15
# ... and over several clusters (spread_shape), where blocks hold 2.4 lines of a 256^2 grid: Poisson 256^2 reads 17%.
SPREAD_MAX_REMOTE = 0.25
# ... and only while the matrix stays on chip (registers and shared memory; each slice step in the
# global workspace took about 0.25 us) and the steps a warp takes one after another in a product past
# its held entries (slice_walk) are at most this many, each about 0.054 us. H200, float64, us an
# iteration on chip / on the grid, before slices shared their long rows: a path of 1,000 vertices whose
# middle is joined to 30, 50, 60, 90, 120 others (25 to 115 steps) 2.88, 3.98, 4.49, 6.14, 7.75 / 6.5 to
# 7.4; a power-law graph Laplacian of 500 rows (420 steps) 22.6 / 6.5, of 1,000 rows (65% of the slices
# in global memory) 148.6 / 7.2; the geometric graph of 2,000 rows (63% in global memory) 12.4 / 4.8.
# Shared with idle lanes: the star of 120 spokes (21 steps and shuffles) 2.94, the power-law graph of
# 500 rows (40) 3.88 (MEASUREMENTS.md).
ONCHIP_MAX_WALK = 64


ONCHIP_PRECONDITIONERS = ("jacobi", "none")  # what the kernel applies (an inverse diagonal or nothing)


class ClustersUnavailable(DeviceError):
    """A system spread over several clusters that this GPU (or this installation) cannot run: ``auto``
    takes the grid path instead."""


def remote_fraction(indptr, indices, shape):
    """The fraction of a CSR pattern's entries (host or device arrays, measured where they are) whose column
    another block of ``shape``'s cluster holds (0 for one block)."""
    n = indptr.size - 1
    if n <= shape.chunk or not indices.size:
        return 0.0
    xp = array_module(indptr)
    rows = entry_rows(indptr, xp)
    return float(xp.mean(rows // shape.chunk != indices[:rows.size] // shape.chunk))


def host_pattern(A):
    """``(indptr, indices)`` of a CSR matrix (host or device) as host arrays."""
    return tuple(np.asarray(v.get() if hasattr(v, "get") else v) for v in (A.indptr, A.indices))


def choose_path(path, n, variant="auto", preconditioner="jacobi", A=None, itemsize=8):
    """``(path, note)``: the GPU kernel for ``n`` rows, ``grid`` or ``on-chip`` (``path`` "auto" or one of
    them); with the matrix ``A`` (CSR), auto also weighs where its product reads fall (:func:`remote_fraction`
    in :func:`latency_shape`'s layout) and whether its layout keeps it on chip with short slices
    (ONCHIP_MAX_WALK). Both PCG variants run on either path; ``variant`` is the one asked for, in
    ``itemsize``-byte reals."""
    if path not in PATHS:
        raise InputError(f"path must be one of {', '.join(PATHS)}, not {path!r}")
    if path == "on-chip" and preconditioner not in ONCHIP_PRECONDITIONERS:
        raise InputError(f"the on-chip path applies Jacobi or no preconditioner, not {preconditioner!r}")
    if path != "auto":
        return path, None
    if preconditioner not in ONCHIP_PRECONDITIONERS:
        return "grid", f"auto: the on-chip path applies Jacobi or no preconditioner, not {preconditioner!r}"
    spread = n > ONCHIP_MAX_ROWS
    if n > SPREAD_MAX_ROWS:
        return "grid", f"auto: {n:,} rows > {SPREAD_MAX_ROWS:,}, the whole GPU"
    if spread and variant == "classic":
        return "grid", (f"auto: classic PCG on chip runs inside one cluster (at most {ONCHIP_MAX_ROWS:,} rows), "
                        f"the whole GPU")
    pattern = (A.indptr, A.indices) if A is not None and hasattr(A, "indptr") else None  # where A is
    shape = latency_shape(n, pattern)
    remote = remote_fraction(*pattern, shape) if pattern is not None else 0.0
    limit = SPREAD_MAX_REMOTE if spread else ONCHIP_MAX_REMOTE
    if remote > limit:
        return "grid", (f"auto: {remote:.0%} of the entries would be read from another block of a cluster "
                        f"(> {limit:.0%}), the whole GPU")
    if pattern is not None:
        indptr, indices = host_pattern(A)  # the layout's choice runs on the host
        start = np.array([0, n])
        chosen = variant if variant in VARIANTS else auto_variant(indptr, start, itemsize, indices)
        layout = choose_layout(indptr, start, itemsize, True, chosen, indices)
        if layout.in_shared < layout.entries:
            return "grid", (f"auto: {1 - layout.in_shared / layout.entries:.0%} of the matrix's slices would lie in "
                            f"global memory on chip, the whole GPU")
        walk = slice_walk(indptr, layout)
        if walk > ONCHIP_MAX_WALK:
            return "grid", (f"auto: its longest rows would take {walk:,} steps of a warp a product on chip "
                            f"(> {ONCHIP_MAX_WALK}), the whole GPU")
    if spread:
        return "on-chip", f"auto: {n:,} rows <= {SPREAD_MAX_ROWS:,}, solved inside {shape.groups} clusters"
    return "on-chip", f"auto: {n:,} rows <= {ONCHIP_MAX_ROWS:,}, solved inside one block or cluster"


@dataclasses.dataclass(frozen=True)
class Shape:
    """How the kernel lays out a system: ``groups`` teams (clusters, where ``team`` > 1) of ``team``
    blocks of ``block`` threads, ``rows`` rows a thread."""

    block: int
    rows: int
    team: int
    groups: int = 1

    @property
    def chunk(self):
        """Rows of a system one block owns."""
        return self.block * self.rows

    def describe(self):
        if self.groups > 1:
            where = f"{self.groups} clusters of {self.team} blocks"
        else:
            where = "one block" if self.team == 1 else f"a cluster of {self.team} blocks"
        return f"{where} of {self.block} threads, {self.rows} row{'s' if self.rows > 1 else ''} a thread"


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the kernel keeps a system: its :class:`Shape`, ``held`` entries of each row in the
    thread's registers, the rest (``entries`` a block at most) in slices, ``in_shared`` of them in
    shared memory and the others in a global workspace; with ``zp_registers`` (classic PCG, one
    block) a thread's rows of z and of the previous direction in its registers, not shared memory."""

    shape: Shape
    held: int
    entries: int
    in_shared: int
    zp_registers: bool = False
    held_k: tuple = None  # where length_order lays the rows out: the entries held of each thread's k-th rows
    order: np.ndarray = dataclasses.field(default=None, compare=False, repr=False)  # length_order's rows

    def held_of(self, k):
        """Entries a thread holds in registers of its k-th rows."""
        return self.held_k[k] if self.held_k else self.held

    @property
    def shares_rows(self):
        """Whether slices give their long rows' entries to lanes with none (``share_slice``): where rows
        keep entries in registers, so that short rows leave lanes idle in the slices."""
        return self.entries > 0 and self.held > 0

    def describe(self):
        if self.entries == 0:
            where = "in registers"
        elif self.in_shared == self.entries:
            where = "in shared memory"
        elif self.in_shared:
            where = f"{self.in_shared / self.entries:.0%} in shared memory, the rest in global memory"
        else:
            where = "in global memory"
        held = "/".join(map(str, self.held_k)) if self.held_k else str(self.held)
        if self.held and self.entries:
            where = f"{held} entries a row in registers, the rest {where}"
        elif self.held_k:
            where = f"{where} ({held} entries a row)"
        order = ", rows by length" if self.order is not None else ""
        return f"{self.shape.describe()}{order}, matrix {where}"


def row_lengths(rowptr, start):
    """Entries of each row of the stacked systems."""
    rowptr = np.asarray(rowptr, dtype=np.int64)
    return np.diff(rowptr)[int(start[0]):int(start[-1])]


def slice_capacity(rowptr, start, shape, held=0):
    """The most matrix entries the slices of any block hold (``kernels/onchip.cu``'s layout).

    A block's rows fall into slices of 32 consecutive rows of a system, each as wide as
    its longest row less the ``held`` entries a thread keeps in registers (one count, or one for each
    of a thread's ``shape.rows`` rows: slice ``s`` of a block holds its threads' k-th rows, k = s //
    (block / 32)); a block holds ``32 * (sum of its slices' widths)`` entries. (Where the kernel shares
    a slice's long rows with other lanes, ``share_slice``, the slice is narrower: this bounds what it
    holds.)
    """
    start = np.asarray(start, dtype=np.int64)
    sizes = np.diff(start)
    if not sizes.size or not sizes.sum():
        return 0
    lengths = row_lengths(rowptr, start)
    per_system = -(-sizes // 32)  # slices a system
    first_slice = np.concatenate(([0], np.cumsum(per_system)))
    system = np.repeat(np.arange(sizes.size), sizes)
    slice_of_row = first_slice[system] + (np.arange(lengths.size) - (start[system] - start[0])) // 32
    widths = np.maximum.reduceat(lengths, np.flatnonzero(np.r_[True, np.diff(slice_of_row) != 0]))
    slice_system = np.repeat(np.arange(sizes.size), per_system)
    within = np.arange(widths.size) - first_slice[slice_system]  # the slice's place in its system
    slices_a_block = shape.chunk // 32
    k = within % slices_a_block // (shape.block // 32)
    widths = np.maximum(widths - np.broadcast_to(np.asarray(held), (shape.rows,))[k], 0)
    blocks = -(-sizes // shape.chunk)
    first_block = np.concatenate(([0], np.cumsum(blocks)))
    block_of_slice = first_block[slice_system] + within // slices_a_block
    block_sums = np.add.reduceat(widths, np.flatnonzero(np.r_[True, np.diff(block_of_slice) != 0]))
    return 32 * int(block_sums.max())


def length_order(lengths, shape, held):
    """One block's system with its rows in the threads' slots by length: ``(order, held_k)``, the row
    in each slot and the entries a thread holds in registers of its k-th rows; ``(None, None)`` where
    that holds no fewer than ``held`` entries of every row.

    Slot ``t + k * block`` (thread t's k-th row) takes the rows longest first: k = 0 first and,
    within k, lane by lane across the warps, so that a warp's k-th rows are about equally long and its
    longest rows spread over the warps (a slice's long rows are shared with its idle lanes). The k-th
    rows then hold at most their longest (compiled per row group, ``ONCHIP_HELD_K``): shorter groups
    gather and add fewer padding entries. H200, 1138_bus (384 threads, 3 rows a thread, 8 entries
    held), us an iteration: rows as given 2.10, by length alone 2.12, by length holding 8, 4 and 3
    entries 1.94-1.96 (MEASUREMENTS.md).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n = lengths.size
    if shape.team != 1 or shape.groups != 1 or shape.rows == 1 or held == 0 or n > shape.chunk:
        return None, None
    slot = np.arange(n)
    thread, k = slot % shape.block, slot // shape.block
    slots = np.lexsort((thread // 32, thread % 32, k))  # by k, then lane, then warp
    order = np.empty(n, dtype=np.int64)
    order[slots] = np.argsort(-lengths, kind="stable")
    grouped = np.zeros(shape.chunk, dtype=np.int64)
    grouped[:n] = lengths[order]
    held_k = tuple(int(v) for v in np.minimum(grouped.reshape(shape.rows, shape.block).max(axis=1), held))
    if sum(held_k) >= shape.rows * held:
        return None, None
    return order, held_k


def shared_slice(tails):
    """``(steps, shuffles)`` of a slice whose 32 rows have ``tails`` entries past the held ones, its long
    rows shared with its idle lanes as ``kernels/onchip.cu``'s ``share_slice`` does: the width W with the
    fewest steps and shuffles (a row of t > W entries takes (t - 1) // W helpers)."""
    tails = np.asarray(tails, dtype=np.int64)
    least, best = int(tails.max(initial=0)), (int(tails.max(initial=0)), 0)
    idle, w = int((tails == 0).sum()), 1
    while w < least:
        need = np.where(tails > w, (tails - 1) // w, 0)
        if need.sum() <= idle and w + need.max() < least:
            least, best = int(w + need.max()), (w, int(need.max()))
        w += 1
    return best


def slice_walk(rowptr, layout):
    """The most steps a warp of ``layout`` takes in a product past its held entries, one system of
    CSR ``rowptr`` (host): the widest of its slices (each as wide as its longest row less the held
    entries) and, where the layout shares long rows (:attr:`Layout.shares_rows`), its slices' shuffles."""
    shape = layout.shape
    lengths = np.diff(np.asarray(rowptr, dtype=np.int64))
    if layout.order is not None:
        lengths = lengths[layout.order]
    padded = np.zeros(-(-lengths.size // shape.chunk) * shape.chunk, dtype=np.int64)
    padded[:lengths.size] = lengths
    slices = padded.reshape(-1, 32)  # slice s: rows 32 s.., warp s % (block / 32) of block s // (chunk / 32)
    slices_a_block, warps = shape.chunk // 32, shape.block // 32
    k = np.arange(len(slices)) % slices_a_block // warps  # the slice's row group
    held = np.array([layout.held_of(group) for group in range(shape.rows)])[k]
    tails = np.maximum(slices - np.minimum(slices.max(axis=1), held)[:, None], 0)
    steps, shuffles = tails.max(axis=1), np.zeros(len(tails), dtype=np.int64)
    if layout.shares_rows:
        for s in np.flatnonzero(steps > 1):
            steps[s], shuffles[s] = shared_slice(tails[s])
    warp = np.arange(len(tails)) // slices_a_block * warps + np.arange(len(tails)) % slices_a_block % warps
    most = np.zeros(warp.max() + 1, dtype=np.int64)
    np.maximum.at(most, warp, steps)
    np.add.at(most, warp, shuffles)
    return int(most.max())


def shared_vectors(variant, team, zp_registers=False):
    """Vectors of a block's rows in its shared memory: classic z and two directions (only the new
    direction with z and the previous one in registers); single-reduction u, and in a cluster r, s
    and w of two iterations (what the other blocks form u from), and the inverse diagonal and x."""
    if variant == "classic":
        return 1 if zp_registers else 3
    return 9 if team > 1 else 3


def shared_bytes(shape, entries, itemsize, variant="classic", zp_registers=False):
    """Dynamic shared memory of a block: its shared vectors, plus ``entries`` of the matrix."""
    return shared_vectors(variant, shape.team, zp_registers) * shape.chunk * itemsize + entries * (itemsize + 4)


def scratch_bytes(shape):
    """The kernel's static shared memory (``TeamScratch``): the warps', the team's and the block's
    totals of three values twice, two mbarriers, a slice width per 32 rows; over several clusters two
    addresses and a count."""
    totals = 2 * TEAM_SUMS * 8  # two buffers of doubles
    spread = 24 if shape.groups > 1 else 0
    return totals * (shape.block // 32) + totals * shape.team + totals + 16 + 4 * (shape.chunk // 32) + spread


def held_entries(shape, variant, itemsize, longest):
    """Entries of each row a thread keeps in registers (one block an SM): what the registers left
    beside the rows' vectors (classic x, r, q, p and the inverse diagonal; single-reduction p, r, s, w,
    u: it reads x and the inverse diagonal from shared memory) and RESERVED_REGISTERS (with
    SPREAD_REGISTERS over several clusters) leave, at most the longest row."""
    words = itemsize // 4
    warps_a_scheduler = -(-shape.block // 128)
    per_thread = min(THREAD_REGISTERS, QUARTER_REGISTERS // (32 * warps_a_scheduler) // 8 * 8)
    vectors = 5 * words * shape.rows
    reserved = RESERVED_REGISTERS[variant, shape.team > 1] + (SPREAD_REGISTERS if shape.groups > 1 else 0)
    room = per_thread - reserved - REGISTERS_A_ROW * shape.rows - vectors
    return int(max(0, min(longest, room // ((words + 1) * shape.rows))))


def latency_shape(rows, pattern=None, spread=True):
    """The layout that solves one system of ``rows`` rows fastest (measured on the H200, see
    MEASUREMENTS.md): one block of up to 512 threads up to 2,048 rows; above, a cluster of 16 blocks
    of one row a thread while that takes at most ONE_ROW_BLOCK threads a block; else, or where its
    smaller blocks would read more than ONCHIP_MAX_REMOTE of the entries of the system's CSR
    ``pattern`` (``(indptr, indices)``, host or device arrays, where given) from other blocks,
    :func:`cluster_shape`; above ONCHIP_MAX_ROWS rows, with ``spread`` (single-reduction PCG), :func:`spread_shape`.
    (Poisson 64^2, us an iteration, classic / single-reduction: 16 blocks of 256 threads 2.23 / 2.05,
    8 of 512 2.39 / 2.16; lap2D_5pt_n100: 16 of 640 2.75 / 2.24, 10 of 512 with 2 rows a thread 2.89 /
    2.86; Poisson 128^2: 16 of 512 with 2 rows 2.80 / 2.74, 16 of 1,024 3.29 / 3.06.)"""
    if rows <= 2048:
        per_thread = -(-rows // 512)
        return Shape(max(32, -(-rows // (32 * per_thread)) * 32), per_thread, 1)
    if spread and ONCHIP_MAX_ROWS < rows <= SPREAD_MAX_ROWS:
        return spread_shape(rows)
    block = -(-rows // (32 * MAX_TEAM)) * 32
    one_row = Shape(block, 1, -(-rows // block))
    if block <= ONE_ROW_BLOCK and (pattern is None or remote_fraction(*pattern, one_row) <= ONCHIP_MAX_REMOTE):
        return one_row
    return cluster_shape(rows)


def spread_shape(rows):
    """Clusters of 16 blocks of one row a thread, as few clusters as keep blocks at most ONE_ROW_BLOCK
    threads (at most MAX_GROUPS): a system too large for one cluster, the clusters' reductions
    combined through global memory (single-reduction PCG only)."""
    groups = min(MAX_GROUPS, -(-rows // (MAX_TEAM * ONE_ROW_BLOCK)))
    block = -(-rows // (32 * MAX_TEAM * groups)) * 32
    return Shape(block, 1, MAX_TEAM, groups)


def cluster_shape(rows):
    """A cluster of blocks of 512 threads (1,024 above 16,384 rows) for a system of more than 2,048
    rows: as many blocks as give each thread one row, up to 16, and then the fewest blocks for the rows
    a thread must hold (batches of such systems take it; one such system where latency_shape's
    smaller blocks do not suit)."""
    block = 512 if rows <= 2 * 512 * MAX_TEAM else 1024
    team = min(MAX_TEAM, -(-rows // block))
    per_thread = -(-rows // (team * block))
    return Shape(block, per_thread, -(-rows // (block * per_thread)))


def layout_bytes(layout, entries, itemsize, variant):
    """Shared memory of a block of ``layout`` holding ``entries`` of the matrix, static included."""
    return shared_bytes(layout.shape, entries, itemsize, variant, layout.zp_registers) + scratch_bytes(layout.shape)


def candidate_shapes(rows, latency, pattern=None, spread=True):
    """Layouts for systems of up to ``rows`` rows, in order of preference.

    A batch (throughput) wants one block a system with as many rows a thread as
    registers allow (MAX_ROWS), so that several systems share an SM and each thread
    has independent rows' loads in flight (H200, 10,000 systems of 1,024 rows: blocks
    of 128 threads, 8 rows a thread, 3 an SM, 15.4 ms; 256 threads, 4 rows, 19.8 ms;
    MEASUREMENTS.md); one system (latency) takes :func:`latency_shape`, and a batch of systems
    of more than 2,048 rows :func:`cluster_shape` (:func:`choose_layout` takes the first that fits).
    """
    shapes = []
    if not latency and rows <= 256 * MAX_ROWS:
        block = max(32, -(-rows // (32 * MAX_ROWS)) * 32)
        shapes.append(Shape(block, -(-rows // block), 1))
    shape = latency_shape(rows, pattern, spread) if latency or rows <= 2048 else cluster_shape(rows)
    if shape.rows <= MAX_ROWS:
        shapes.append(shape)
    return shapes


def choose_layout(rowptr, start, itemsize, latency, variant="classic", indices=None):
    """The first candidate :class:`Layout` whose vectors and matrix fit in a block's shared memory
    (after what one system's threads hold in registers), else the first whose vectors do, the
    rest of its matrix in a global workspace. A batch holds no entries in registers (several
    blocks share an SM) but, in one block, classic PCG's z and previous direction (one shared
    vector instead of three: more blocks an SM). ``indices``: one system's CSR columns, which
    :func:`latency_shape` weighs."""
    rows = int(np.diff(np.asarray(start)).max())
    pattern = (np.asarray(rowptr), np.asarray(indices)) if indices is not None else None
    # classic PCG's two reductions an iteration keep a system inside one cluster
    shapes = candidate_shapes(rows, latency, pattern, spread=variant != "classic")
    if not shapes:
        raise InputError(f"a system of {rows:,} rows is too large to solve on chip "
                         f"(at most {MAX_TEAM * 1024 * MAX_ROWS:,})")
    lengths = row_lengths(rowptr, start)
    longest = int(lengths.max(initial=0))
    layouts = []
    for shape in shapes:
        held = held_entries(shape, variant, itemsize, longest) if latency else 0
        zp_registers = not latency and variant == "classic" and shape.team == 1
        order, held_k = length_order(lengths, shape, held) if latency and len(start) == 2 else (None, None)
        entries = (slice_capacity(rowptr, start, shape, held) if order is None else
                   slice_capacity(np.concatenate(([0], np.cumsum(lengths[order]))), [0, lengths.size], shape, held_k))
        layouts.append(Layout(shape, held, entries, 0, zp_registers, held_k, order))
    for layout in layouts:
        if layout_bytes(layout, layout.entries, itemsize, variant) <= SHARED_LIMIT:
            return dataclasses.replace(layout, in_shared=layout.entries)
    for layout in layouts:
        room = SHARED_LIMIT - layout_bytes(layout, 0, itemsize, variant)
        if room >= 0:  # whole warps' entries (32 at a time) in shared memory, the rest global
            return dataclasses.replace(layout, in_shared=min(layout.entries, room // (itemsize + 4) // 32 * 32))
    raise InputError(f"systems of {rows:,} rows need more shared memory than a block has "
                     f"({variant} PCG on chip)")


def auto_variant(rowptr, start, itemsize, indices=None):
    """``auto``'s PCG variant for one system on chip: classic in one block whose rows classic holds
    whole in registers, else single-reduction where its layout keeps the matrix on chip.

    In a cluster single-reduction's one reduction saves more than its extra work costs (other
    blocks' u formed from four vectors read in their shared memory); in one block classic's second
    reduction is cheap and its fewer vectors leave registers for whole rows, but where rows spill
    into shared memory anyway single-reduction was faster. H200, float64, Jacobi, us per iteration,
    classic / single-reduction, layouts of :func:`latency_shape`: Poisson 64^2 (16 blocks) 2.23 /
    2.05, lap2D_5pt_n100 (16) 2.75 / 2.24, Poisson 128^2 (16) 2.80 / 2.74; one block: 1138_bus (8 of
    up to 18 entries in registers) 2.81 / 2.49, gr_900_900_crg (whole rows in registers) 1.72 / 2.30
    (MEASUREMENTS.md). Above ONCHIP_MAX_ROWS rows single-reduction, the variant that spreads a system
    over several clusters (:func:`spread_shape`).
    """
    if latency_shape(int(np.diff(np.asarray(start)).max())).groups > 1:
        return "single-reduction"  # the only variant spread over several clusters
    classic = choose_layout(rowptr, start, itemsize, True, "classic", indices)
    if classic.shape.team == 1 and classic.entries == 0:
        return "classic"
    try:
        single = choose_layout(rowptr, start, itemsize, True, "single-reduction", indices)
    except InputError:
        return "classic"
    return "single-reduction" if single.in_shared == single.entries else "classic"


def kernel_program(layout, variant, real, min_blocks):
    """Arguments of :func:`kernels.module` for the on-chip kernel of ``layout`` (a :class:`Layout`)
    running ``variant`` in ``real`` ("double" or "float"), ``min_blocks`` blocks an SM."""
    shape = layout.shape
    defines = (("ONCHIP_BLOCK", str(shape.block)), ("ONCHIP_ROWS", str(shape.rows)), ("ONCHIP_TEAM", str(shape.team)),
               ("ONCHIP_GROUPS", str(shape.groups)), ("ONCHIP_MAX_SUMS", str(TEAM_SUMS)),
               ("ONCHIP_MIRROR_VECTORS", str(MIRROR_VECTORS)),
               ("ONCHIP_HELD", str(layout.held)), ("ONCHIP_SINGLE", str(int(variant != "classic"))),
               *((("ONCHIP_HELD_K", ",".join(map(str, layout.held_k))),) if layout.held_k else ()),
               ("ONCHIP_ORDERED", str(int(layout.order is not None))),
               ("ONCHIP_SLICED", str(int(layout.entries > 0))),
               ("ONCHIP_SPLIT", str(int(layout.shares_rows))),
               ("ONCHIP_GLOBAL", str(int(layout.in_shared < layout.entries))),
               ("ONCHIP_ZP_REGISTERS", str(int(layout.zp_registers))),
               ("ONCHIP_SHARED_VECTORS", str(shared_vectors(variant, shape.team, layout.zp_registers))),
               ("ONCHIP_MIN_BLOCKS", str(min_blocks)))
    return dict(name="onchip", real=real, defines=defines, before=("stopping",), structs=(STATE, PROGRESS, ONCHIP_RUN))


def resident_clusters(function, shape, shared_bytes):
    """Clusters of ``shape`` (a :class:`Shape`) of the compiled ``function`` the GPU holds at once."""
    try:
        from cuda.bindings import driver
    except ImportError:
        raise ClustersUnavailable("spreading a system over several clusters needs cuda-bindings (pip install "
                                  "graphsolve-cuda[cuda12] or [cuda13]) to count the clusters the GPU holds") from None
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = shape.team * shape.groups, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = shape.block, 1, 1
    config.sharedMemBytes = shared_bytes
    cluster = driver.CUlaunchAttribute()
    cluster.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    cluster.value.clusterDim.x, cluster.value.clusterDim.y, cluster.value.clusterDim.z = shape.team, 1, 1
    config.attrs, config.numAttrs = [cluster], 1
    err, count = driver.cuOccupancyMaxActiveClusters(driver.CUfunction(function.ptr), config)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise ClustersUnavailable(f"cuOccupancyMaxActiveClusters failed ({err.name})")
    return int(count)


class OnChipKernel:
    """The compiled kernel for a layout, and its shared-memory plan over stacked systems.

    Parameters
    ----------
    rowptr, start : host int arrays
        The stacked CSR row pointer and the systems' first rows (``B + 1`` entries).
    real : {"double", "float"}
    latency : bool
        Lay out for one system's latency rather than a batch's throughput (:func:`candidate_shapes`).
        Each block's rows of the matrix are laid out in registers and shared memory, and what does
        not fit there in a global workspace this object holds.
    variant : {"classic", "single-reduction"}
        The PCG iteration the kernel runs.
    indices : host int array, optional
        One system's CSR columns (:func:`latency_shape` weighs its reads from other blocks).
    """

    def __init__(self, rowptr, start, real="double", latency=False, variant="classic", indices=None):
        import cupy
        itemsize = 8 if real == "double" else 4
        self.variant = variant
        self.layout = choose_layout(rowptr, start, itemsize, latency, variant, indices)
        self.shape = self.layout.shape
        self.shared_bytes = shared_bytes(self.shape, self.layout.in_shared, itemsize, self.variant,
                                         self.layout.zp_registers)
        self.systems = int(np.asarray(start).size - 1)
        # A batch wants as many blocks an SM as shared memory allows (registers are capped to match);
        # one system wants each block fast.
        block_bytes = self.shared_bytes + scratch_bytes(self.shape) + 1024  # the driver reserves 1 KB a block
        self.min_blocks = 1 if latency else max(1, min(2048 // self.shape.block, SM_SHARED // block_bytes))
        mod = kernels.module(**kernel_program(self.layout, self.variant, real, self.min_blocks))
        kernel = mod.get_function("onchip_pcg")
        kernel.max_dynamic_shared_size_bytes = self.shared_bytes
        self._function = kernel.kernel
        if self.shape.team > PORTABLE_TEAM:
            cupy.cuda.driver.funcSetAttribute(self._function.ptr, NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
        per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(self._function.ptr, self.shape.block,
                                                                             self.shared_bytes)
        sms = int(kernels.device_attribute("MultiProcessorCount"))
        members = self.shape.team * self.shape.groups  # blocks a system
        # One wave: a team a system up to what the GPU holds at once; teams then take the next systems.
        teams = max(1, min(self.systems, int(per_sm) * sms // members))
        self.grid = teams * members
        self.spread = None  # one system over several clusters: the global mirror, the teams' sums, their counter
        if self.shape.groups > 1:
            resident = resident_clusters(self._function, self.shape, self.shared_bytes)
            if resident < self.shape.groups:
                raise ClustersUnavailable(f"this GPU holds {resident} clusters of {self.shape.team} blocks at once; "
                                          f"a system of {int(start[-1]):,} rows on chip needs {self.shape.groups}")
            self.spread = dict(mirror=cupy.empty(MIRROR_VECTORS * int(start[-1]), dtype=np.float64
                                                 if real == "double" else np.float32),
                               group_sums=cupy.zeros(2 * self.shape.groups * TEAM_SUMS),
                               group_arrivals=cupy.zeros(1, dtype=np.uint64))
        self.order = None  # length_order's rows in the threads' slots and each row's slot (device)
        if self.layout.order is not None:
            slot = np.empty_like(self.layout.order)
            slot[self.layout.order] = np.arange(slot.size)
            self.order = tuple(cupy.asarray(v, dtype=np.int32) for v in (self.layout.order, slot))
        self.workspace = None  # the entries of each block that shared memory cannot hold
        if self.layout.in_shared < self.layout.entries:
            entries = self.systems * members * (self.layout.entries - self.layout.in_shared)
            self.workspace = (cupy.empty(entries, dtype=np.float64 if real == "double" else np.float32),
                              cupy.empty(entries, dtype=np.int32))

    def describe(self):
        return f"on chip: {self.layout.describe()}"

    def pack(self, **fields):
        """The argument struct (``ONCHIP_RUN``'s fields; the matrix layout is filled in)."""
        val, col = self.workspace or (None, None)
        order, slot = self.order or (None, None)
        return ONCHIP_RUN.pack(matrix_capacity=self.layout.entries, matrix_shared=self.layout.in_shared,
                               sell_val=val, sell_col=col, order=order, slot=slot, **(self.spread or {}), **fields)

    def launch(self, args, handle=0, stream=None):
        # A system over several clusters waits on all of them: a cooperative launch, which the driver
        # refuses unless every block is resident at once.
        self._function((self.grid,), (self.shape.block,), (args, np.uint64(handle)), shared_mem=self.shared_bytes,
                       stream=stream, enable_cooperative_groups=self.shape.groups > 1)


# The on-chip kernel's vectors besides x and r: its argument's name and the solver's vector.
ON_CHIP_VECTORS = {"classic": {"z": "z", "p": "p0"}, "single-reduction": {"p": "p", "s": "s0", "w": "w0"}}


class OnChipPCG(GPUPCG):
    """PCG on one small system inside one block or cluster: :class:`~solvers.pcg.gpu.GPUPCG` with its
    persistent grid kernel replaced by ``kernels/onchip.cu`` (resumable between launches).

    The engine, buffers, input checks and true residual are GPUPCG's; a launch runs
    up to ``unroll`` iterations (by default the whole solve), and a solve's first
    launch does the set-up pass itself. ``auto`` runs :func:`auto_variant`'s choice.
    """

    default_unroll = 2**31 - 1

    def _choose_variant(self, M):
        (rowptr, indices), start, real = host_pattern(M), np.array([0, M.shape[0]]), kernels.ctype(self.dtype)
        if self.requested_variant == "auto":
            variant = auto_variant(rowptr, start, 8 if real == "double" else 4, indices)
        else:
            variant = super()._choose_variant(M)
        self.onchip = OnChipKernel(rowptr, start, real, latency=True, variant=variant, indices=indices)
        return variant

    def _uses(self, vector):
        return vector in ("x", self._variant.residual) or vector in ON_CHIP_VECTORS[self.variant].values()

    def _setup(self, A):
        super()._setup(A)
        self._csr_values = to_device_csr(A, self.dtype).data
        self._rows = self.cupy.asarray(np.array([0, self.n], dtype=np.int32))
        self.norms = self.cupy.zeros(2)  # the kernel's ||b - A x||, ||b||; solve() takes GPUPCG's true residual

    def update_values(self, A):
        kernel = self.onchip
        super().update_values(A)  # a new pattern sets everything up again, this path's kernel included
        if self.onchip is kernel:  # the same pattern: the new values in place (the captured address)
            self._csr_values[...] = to_device_csr(A, self.dtype).data

    def describe(self):
        return self.onchip.describe()

    def _start(self, tol, maxiter):
        self._reset_state(tol, maxiter)  # iteration -1: the first launch does the set-up pass

    def _prepare_on_device(self, rtol, atol, maxiter):
        self._device_state(rtol, atol, maxiter)  # the first launch does the set-up pass

    def launch_run(self, count, handle, stream=None):
        indptr, indices = self._pattern
        v = self.vectors
        vectors = {kernel_name: v[name] for kernel_name, name in ON_CHIP_VECTORS[self.variant].items()}
        args = self.onchip.pack(rowptr=indptr, col=indices, val=self._csr_values, dinv=self.dinv, start=self._rows,
                                b=self.b, x=self.x, r=self.r, st=self.state, norms=self.norms, history=self.history,
                                progress=self.progress.device_ptr, systems=1, count=int(count), fresh=0, **vectors)
        self.onchip.launch(args, handle, stream)
