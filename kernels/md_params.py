"""The parameter struct of ``md.cu``: every MD kernel takes one ``MdParams`` by value.

Defined once, here, with :class:`~.structs.Struct` (NumPy twin, C definition
and layout checks generated into the program). Real-valued fields have the
kernels' precision, so the structs are made per precision; the pair-potential
parameters are a struct per potential, and ``MdParams.pair`` has the type of
the potential a program is compiled for (``md.cu``'s functor of that name reads it).
"""
import functools

from .structs import Struct

# Pair functor of md.cu -> the fields of its parameters.
PAIRS = {
    "PairLJ": (("rc_sq", "real"), ("sigma_sq", "real"), ("eps4", "real"), ("eps24", "real"), ("eshift", "double")),
    "PairMorse": (("rc_sq", "real"), ("d0", "real"), ("alpha", "real"), ("r0", "real"), ("eshift", "double")),
}


# The control block md.cu's kernels and the host share (unsigned long long ctl[CTL_SIZE]), its slots:
C_STEP = 0      # last completed step
C_TARGET = 1    # step at which the chunk stops
C_REQ = 2       # some particle moved more than skin/2 since the last build (a rebuild is due)
C_REBUILD = 3   # rebuild in this step (set by md_run, by md_build_gate or by the host)
C_BUILDS = 4    # list builds so far
C_STATUS = 5    # ST_* below
C_NBMAX = 6     # largest neighbour count that did not fit (0: all fit)
C_CELLMAX = 7   # largest cell occupancy that did not fit (0: all fit)
C_BAD = 8       # n - index of the lowest particle that moved implausibly (0: none)
C_FAR = 9       # distributed runs: some particle moved past the ghost margin since the ghosts were chosen
C_FORCED = 10   # step whose forces are computed
C_SYNC = 11     # md_run's grid barrier counter (grid_sync)
C_ARRIVE = 12   # blocks of md_force done (last-block counter)
C_DRIFTED = 13  # blocks of md_kick_drift done (last-block counter)
CTL_SIZE = 16
# ... and the states of a chunk (ctl[C_STATUS]):
ST_RUNNING = 0
ST_DONE = 1
ST_OVERFLOW = 2  # a list or its cells did not fit: the host grows them and redoes the chunk
ST_UNSTABLE = 3
ST_REBUILD = 4   # distributed runs: the ranks agreed on a list build the host does (with a migration)


def neighbour_list_entries(maxnb, rows, tpp):
    """Entries md.cu's neighbour list needs for ``rows`` particles of up to ``maxnb`` neighbours each.

    ``nlist_index`` lays slot s of particle g at ``((s // tpp) * rows + g) * tpp + s % tpp`` (a
    group's ``tpp`` lanes read consecutive entries; :func:`kernels.md_ref.neighbour_slot`), so the
    slots come in whole runs of ``tpp``: ``maxnb`` rounded up to a multiple of ``tpp``, times ``rows``.
    """
    return -(-int(maxnb) // int(tpp)) * int(tpp) * int(rows)


def ctl_defines():
    """The control block's slots, size and states as the kernels' preprocessor definitions."""
    return tuple((name, str(value)) for name, value in globals().items()
                 if name.startswith(("C_", "ST_")) or name == "CTL_SIZE")


def _fields(spec, real):
    return [(name, real if kind == "real" else kind) for name, kind in spec]


@functools.lru_cache(maxsize=None)
def potential_struct(real, pair):
    """The parameters of the functor ``pair`` (``<pair>Params``); md.cu reads every potential's, so
    programs define them all (:func:`all_structs`)."""
    return Struct(f"{pair}Params", _fields(PAIRS[pair], real))


def all_structs(real, pair):
    """The structs a program compiled for ``pair`` defines: ``MdParams``, every potential's parameters
    and ``RankFrame``."""
    return (params_struct(real, pair), *(potential_struct(real, p) for p in PAIRS if p != pair), RANK_FRAME)


# Distributed runs: a rank's place in the decomposition, for the kernels of a list build (md.cu's
# md_records, md_unpack, md_ghost_routes). origin: of the rank's frame (global = frame + origin);
# box: the periodic box; width: of a sub-box; lo, hi: the rank's sub-box; reach: the ghost shell's
# width; grid: ranks along x, y, z; coords: the rank's place in the grid; offsets[r]: the neighbour
# offset route r goes through, as (ox + 1) * 9 + (oy + 1) * 3 + (oz + 1).
ROUTES = 26
RANK_FRAME = Struct("RankFrame", [
    ("origin", "double[3]"), ("box", "double[3]"), ("width", "double[3]"), ("lo", "double[3]"), ("hi", "double[3]"),
    ("reach", "double"), ("grid", "int[3]"), ("coords", "int[3]"), ("offsets", f"int[{ROUTES}]")])


@functools.lru_cache(maxsize=None)
def params_struct(real, pair):
    """``MdParams`` for ``real_t`` = ``real`` ("double" or "float") and the functor ``pair`` (a key of :data:`PAIRS`)."""
    def fields(spec):
        return _fields(spec, real)

    box = Struct("Box", fields([("lx", "real"), ("ly", "real"), ("lz", "real")]))
    # nx*ny*nz cells of capacity cap; s* = cells per unit length.
    cells = Struct("Cells", fields([("nx", "int"), ("ny", "int"), ("nz", "int"), ("cap", "int"), ("sx", "real"),
                                    ("sy", "real"), ("sz", "real")]))
    # Langevin: gamma_m = m / damp, noise = sqrt(24 kT m / (damp dt)), Philox key (seed_lo, seed_hi).
    bath = Struct("Bath", [("on", "int"), ("gamma_m", "double"), ("noise", "double"), ("seed_lo", "unsigned int"),
                           ("seed_hi", "unsigned int")])
    potential = potential_struct(real, pair)
    vec4 = "struct vec4*"  # md.cu defines vec4; the elaborated name declares it here
    return Struct("MdParams", [
        ("pos", vec4), ("pos_alt", vec4), ("vel", vec4), ("frc", vec4), ("img", "int4*"), ("hold", vec4),
        ("pe", "double*"), ("vir", "double*"), ("partial", "double*"), ("thermo", "double*"), ("nlist", "int*"),
        ("ncount", "int*"), ("order", "int*"), ("ids", "const long long*"), ("ctl", "unsigned long long*"),
        ("planned", vec4),     # distributed runs: own particles' positions when the ghosts were chosen
        ("cell_count", "int*"), ("cell_atoms", "int*"), ("cell_sorted", "int*"), ("cell_pos", vec4),
        ("cell_start", "int*"),
        ("n", "int"),          # particles integrated, listed and forced (a rank's own)
        ("n_local", "int"),    # particles binned: the n own, then ghost copies (n_local == n on one GPU)
        ("tpp", "int"), ("by_cell", "int"), ("ncells", "int"), ("maxnb", "int"),
        ("count", "int"),      # md_run: steps a launch at most
        ("dt", real), ("half_dt_m", real), ("trigger_sq", real), ("max_move_sq", real), ("rlist_sq", real),
        ("margin_sq", real),   # distributed runs: squared distance from planned within which lists are rebuilt in place
        ("mass", "double"), ("box", box), ("cells", cells), ("bath", bath), ("pair", potential)])


def pack(real, pair, values):
    """One ``MdParams`` (a NumPy structured scalar, passed to kernels by value) from ``values``.

    ``values`` maps every field to a number, a device array or address, or (nested
    structs) a dict of that struct's fields.
    """
    struct = params_struct(real, pair)
    missing = {name for name, _ in struct.fields} - set(values)
    if missing:
        raise KeyError(f"missing MdParams fields: {', '.join(sorted(missing))}")
    nested = {name: kind for name, kind in struct.fields if isinstance(kind, Struct)}
    return struct.pack(**{k: nested[k].pack(**v) if k in nested else v for k, v in values.items()})
