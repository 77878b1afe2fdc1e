"""Smoothed-aggregation AMG hierarchy built on the GPU: CuPy, cuSPARSE products and ``kernels/amg_setup.cu``.

The steps are PyAMG's ``smoothed_aggregation_solver`` with its defaults but for
the aggregation, which is parallel (Bell, Dalton and Olson, "Exposing
fine-grained parallelism in algebraic multigrid methods", SIAM J. Sci. Comput.
34(4), 2012, as in CUSP and AmgX) instead of PyAMG's greedy sweep:

1. symmetric strength of connection: ``(i, j)`` is strong when
   ``a_ij != 0`` and ``a_ij^2 >= theta^2 |a_ii a_jj|`` (on the matrix of the blocks' Frobenius
   norms when a level has several unknowns a node);
2. a maximal distance-2 independent set of the strength graph, the nodes ranked
   by a seeded hash (deterministic: no atomics race decides anything); its nodes
   are the aggregates' roots, their neighbours join them, then the remaining
   nodes join a neighbour's aggregate; isolated nodes stay out, as in PyAMG;
3. the tentative prolongator ``T``: the near-nullspace ``B`` (``k`` vectors,
   constants by default) orthonormalised on each aggregate (QR by modified
   Gram-Schmidt, PyAMG's ``fit_candidates``), ``R`` the next level's ``B``, so
   a coarse level has ``k`` unknowns an aggregate;
4. ``P = T - (omega / rho) D^{-1} A T``, ``omega = 4/3``, ``rho`` a Lanczos estimate
   of the largest eigenvalue of ``D^{-1} A`` (PyAMG's Jacobi prolongation smoother);
5. ``R = P^T`` and the Galerkin operator ``R A P`` (two sparse products), until a
   level has at most ``coarse_size`` nodes or there are ``max_levels`` levels;
6. the coarsest operator's dense (pseudo-)inverse by Cholesky.

Unlike PyAMG, ``B`` is used as given (PyAMG's default first smooths it with
Gauss-Seidel, a sequential method).

The same steps run on the host with the kernels' NumPy meaning
(:mod:`solvers.kernels.amg_setup_ref`) and SciPy: :func:`reference_backend`,
what the tests check the device against. The hierarchy is built in float64.
"""
import numpy as np

from ...backend import is_cupy_sparse
from ...errors import InputError
from ...kernels import amg_setup_ref
from .spectrum import largest_scaled_eigenvalue

#: PyAMG's Jacobi prolongation smoother weight (``smooth=('jacobi', {'omega': 4/3})``), over ``rho(D^-1 A)``.
PROLONGATOR_OMEGA = 4.0 / 3.0
#: PyAMG's ``fit_candidates`` tolerance: a near-nullspace column that loses all but this fraction
#: of its norm on an aggregate to the earlier ones is dropped there.
FIT_TOL = 1e-10
#: Seed of the hash that ranks the nodes in the independent-set rounds.
SEED = 0x2545F491
#: Threads per block of the set-up kernels.
BLOCK = 256


class ReferenceBackend:
    """The set-up's array operations on the host: NumPy, SciPy and :mod:`~solvers.kernels.amg_setup_ref`."""

    def __init__(self):
        import scipy.linalg
        import scipy.sparse
        self.xp, self.sparse, self.linalg = np, scipy.sparse, scipy.linalg

    @staticmethod
    def to_host(M):
        return M

    @staticmethod
    def cholesky(M):
        """The lower Cholesky factor, :class:`numpy.linalg.LinAlgError` when ``M`` is not positive definite."""
        return np.linalg.cholesky(M)

    def product(self, A, B):
        """``A @ B`` with every structural entry kept, as cuSPARSE keeps it (SciPy drops exact zeros)."""
        pattern = (_ones(A) @ _ones(B)).tocoo()
        numeric = (A @ B).tocoo()
        coordinates = (np.concatenate([pattern.row, numeric.row]), np.concatenate([pattern.col, numeric.col]))
        values = np.concatenate([np.zeros(pattern.nnz), numeric.data])
        return self.sparse.coo_matrix((values, coordinates), shape=pattern.shape).tocsr()

    def strong_connections(self, C, diagonal, theta):
        return amg_setup_ref.strong_connections(C.indptr, C.indices, C.data, diagonal, theta)

    def mis_initial_keys(self, C, strong):
        return amg_setup_ref.mis_initial_keys(C.indptr, strong, SEED)

    def neighbourhood_max(self, C, strong, keys):
        return amg_setup_ref.neighbourhood_max(C.indptr, C.indices, strong, keys)

    def mis_decide(self, reach, keys):
        return amg_setup_ref.mis_decide(reach, keys)

    def join_roots(self, C, strong, keys, root_number):
        return amg_setup_ref.join_roots(C.indptr, C.indices, strong, keys, root_number)

    def join_neighbours(self, C, strong, first):
        return amg_setup_ref.join_neighbours(C.indptr, C.indices, strong, first)

    def fit_candidates(self, offsets, q, tol):
        return amg_setup_ref.fit_candidates(offsets, q, q.shape[1], tol)

    def smooth_prolongator(self, X, factor, T):
        X.data = amg_setup_ref.smooth_prolongator(X.indptr, X.indices, X.data, factor, T.indptr, T.indices, T.data)
        return X


class DeviceBackend:
    """The set-up's array operations on the GPU: CuPy, ``cupyx.scipy.sparse`` and ``amg_setup.cu``."""

    def __init__(self):
        from ...backend import require_cupy
        require_cupy()
        import cupy
        import cupyx.scipy.linalg
        import cupyx.scipy.sparse

        from ... import kernels
        self.xp, self.sparse, self.linalg = cupy, cupyx.scipy.sparse, cupyx.scipy.linalg
        module = kernels.module("amg_setup")
        self._kernels = {name: module.get_function(name) for name in (
            "strong_connections", "mis_initial_keys", "neighbourhood_max", "mis_decide", "join_roots",
            "join_neighbours", "fit_candidates", "smooth_prolongator")}

    @staticmethod
    def to_host(M):
        return M.get()

    def cholesky(self, M):
        """The lower Cholesky factor, :class:`numpy.linalg.LinAlgError` when ``M`` is not positive definite."""
        import cupyx
        with cupyx.errstate(linalg="raise"):  # CuPy's default leaves a failed factorisation unreported
            return self.xp.linalg.cholesky(M)

    def product(self, A, B):
        """``A @ B`` (cuSPARSE SpGEMM; structural zeros are kept)."""
        return A @ B

    def _launch(self, name, n, *args):
        if n:
            self._kernels[name](((n + BLOCK - 1) // BLOCK,), (BLOCK,), (np.int32(n), *args))

    def strong_connections(self, C, diagonal, theta):
        strong = self.xp.empty(C.nnz, dtype=self.xp.uint8)
        self._launch("strong_connections", C.shape[0], C.indptr, C.indices, C.data, diagonal,
                     np.float64(theta * theta), strong)
        return strong

    def mis_initial_keys(self, C, strong):
        keys = self.xp.empty(C.shape[0], dtype=self.xp.uint64)
        self._launch("mis_initial_keys", C.shape[0], C.indptr, strong, np.uint32(SEED), keys)
        return keys

    def neighbourhood_max(self, C, strong, keys):
        out = self.xp.empty_like(keys)
        self._launch("neighbourhood_max", C.shape[0], C.indptr, C.indices, strong, keys, out)
        return out

    def mis_decide(self, reach, keys):
        self._launch("mis_decide", keys.size, reach, keys)
        return keys

    def join_roots(self, C, strong, keys, root_number):
        aggregate = self.xp.empty(C.shape[0], dtype=self.xp.int32)
        self._launch("join_roots", C.shape[0], C.indptr, C.indices, strong, keys, root_number, aggregate)
        return aggregate

    def join_neighbours(self, C, strong, first):
        aggregate = self.xp.empty_like(first)
        self._launch("join_neighbours", C.shape[0], C.indptr, C.indices, strong, first, aggregate)
        return aggregate

    def fit_candidates(self, offsets, q, tol):
        k = q.shape[1]
        r = self.xp.empty((offsets.size - 1, k, k), dtype=self.xp.float64)
        self._launch("fit_candidates", offsets.size - 1, np.int32(k), offsets, q, r, np.float64(tol))
        return r

    def smooth_prolongator(self, X, factor, T):
        self._launch("smooth_prolongator", X.shape[0], X.indptr, X.indices, X.data, factor, T.indptr, T.indices,
                     T.data)
        return X


def _ones(M):
    """The pattern of a SciPy CSR matrix with ones for values."""
    import scipy.sparse
    return scipy.sparse.csr_matrix((np.ones(M.nnz), M.indices, M.indptr), shape=M.shape)


def reference_backend():
    """The host backend (NumPy, SciPy): the device's steps in their NumPy meaning."""
    return ReferenceBackend()


def device_backend():
    """The GPU backend (needs CuPy and a device; compiles ``amg_setup.cu`` once a process)."""
    return DeviceBackend()


class LevelStructure:
    """What a level's set-up keeps when only the values change: the aggregation and ``T``.

    Attributes
    ----------
    aggregates : int32 array
        Each node's aggregate, -1 for a node left out (no strong connection).
    count : int
        Number of aggregates.
    tentative : sparse CSR matrix
        ``T``: ``k`` orthonormal columns an aggregate.
    coarse_candidates : array, shape (count * k, k)
        The next level's near-nullspace (the aggregates' R factors).
    """

    def __init__(self, aggregates, count, tentative, coarse_candidates):
        self.aggregates, self.count = aggregates, count
        self.tentative, self.coarse_candidates = tentative, coarse_candidates


class Hierarchy:
    """The built levels: operators ``A_0..A_L``, ``P_k``, ``R_k = P_k^T``, the coarsest inverse.

    Attributes
    ----------
    operators : list of sparse CSR matrices
        ``A_0`` (the given matrix, float64) to the coarsest.
    prolongators, restrictions : lists of sparse CSR matrices
        One fewer than the operators.
    coarse_inverse : 2-D array
        The coarsest operator's pseudo-inverse.
    structure : list of LevelStructure
        What :func:`build_hierarchy` takes back as ``reuse``.
    spectral_radii : list of float
        The estimates of ``rho(D^-1 A_k)`` the prolongators were smoothed with.
    """

    def __init__(self, operators, prolongators, restrictions, coarse_inverse, structure, spectral_radii):
        self.operators, self.prolongators, self.restrictions = operators, prolongators, restrictions
        self.coarse_inverse, self.structure, self.spectral_radii = coarse_inverse, structure, spectral_radii


def independent_set(C, strong, backend):
    """The keys after the MIS(2) rounds: roots (a maximal distance-2 independent set) and nodes out.

    A round takes each undecided node's largest key within distance 2 of it (two
    neighbourhood maxima); the node whose own key that is becomes a root, one that
    sees a root is out. The largest undecided key left always becomes a root, so
    the rounds end.
    """
    xp = backend.xp
    keys = backend.mis_initial_keys(C, strong)
    while int(xp.count_nonzero((keys >> np.uint64(62)) == amg_setup_ref.UNDECIDED)):
        reach = backend.neighbourhood_max(C, strong, backend.neighbourhood_max(C, strong, keys))
        keys = backend.mis_decide(reach, keys)
    return keys


def aggregate(C, theta, backend):
    """MIS(2) aggregation of the strength graph of ``C`` (CSR, one row a node).

    Returns
    -------
    (int32 array, int)
        Each node's aggregate (-1: isolated, left out) and the number of aggregates.
    """
    xp = backend.xp
    strong = backend.strong_connections(C, C.diagonal(), theta)
    keys = independent_set(C, strong, backend)
    is_root = (keys >> np.uint64(62)) == amg_setup_ref.ROOT
    root_number = (xp.cumsum(is_root, dtype=xp.int32) - 1).astype(xp.int32)
    count = int(root_number[-1]) + 1 if root_number.size else 0
    first = backend.join_roots(C, strong, keys, root_number)
    return backend.join_neighbours(C, strong, first), count


def tentative_prolongator(aggregates, count, block, B, backend):
    """``T`` and the next level's near-nullspace from node aggregates (``block`` rows a node).

    Row ``i`` of ``T`` belongs to aggregate ``a = aggregates[i // block]`` and holds
    the ``k`` columns ``a k .. a k + k - 1``: row ``i`` of the aggregate's Q factor
    (zero when the node is left out).
    """
    xp = backend.xp
    n, k = B.shape
    row_aggregate = xp.repeat(aggregates, block) if block > 1 else aggregates
    rows = xp.flatnonzero(row_aggregate >= 0).astype(xp.int32)
    owner = row_aggregate[rows].astype(xp.int64)
    order = xp.argsort(owner * n + rows)  # by aggregate, then row: unique keys, any sort agrees
    offsets = xp.zeros(count + 1, dtype=xp.int32)
    offsets[1:] = xp.cumsum(xp.bincount(owner, minlength=count), dtype=xp.int32)
    q = xp.ascontiguousarray(B[rows[order]], dtype=xp.float64)
    r = backend.fit_candidates(offsets, q, FIT_TOL)
    values = xp.empty_like(q)
    values[order] = q
    indptr = xp.zeros(n + 1, dtype=xp.int32)
    indptr[1:] = xp.cumsum(row_aggregate >= 0, dtype=xp.int32) * k
    indices = (owner[:, None] * k + xp.arange(k)).astype(xp.int32).ravel()
    T = backend.sparse.csr_matrix((values.ravel(), indices, indptr), shape=(n, count * k))
    return T, r.reshape(count * k, k)


def node_matrix(A, block, backend):
    """``A`` with each ``block x block`` block replaced by its Frobenius norm (PyAMG's strength on BSR)."""
    if block == 1:
        return A
    coo = A.tocoo()
    nodes = A.shape[0] // block
    C = backend.sparse.coo_matrix((coo.data * coo.data, (coo.row // block, coo.col // block)), shape=(nodes, nodes))
    C.sum_duplicates()
    C = C.tocsr()
    C.data = backend.xp.sqrt(C.data)
    return C


def smoothed_prolongator(A, T, steps, backend):
    """``P = T - (omega / rho) D^{-1} A T`` and the estimate ``rho`` of ``rho(D^-1 A)``.

    A zero diagonal entry (a coarse unknown whose near-nullspace column was
    dropped) counts as a zero inverse, as in PyAMG.
    """
    xp = backend.xp
    d = A.diagonal()
    inverse_diagonal = xp.where(d != 0, 1.0 / xp.where(d != 0, d, 1.0), 0.0)
    rho = largest_scaled_eigenvalue(A, inverse_diagonal, steps)
    X = backend.product(A, T)
    return backend.smooth_prolongator(X, -(PROLONGATOR_OMEGA / rho) * inverse_diagonal, T), rho


def dense_pseudo_inverse(A, backend):
    """The coarsest operator's inverse by Cholesky, rows and columns of zeros left out (zero in the result)."""
    xp = backend.xp
    dense = A.toarray()
    kept = xp.flatnonzero(xp.abs(dense).sum(axis=1) > 0)
    block = dense[kept][:, kept]
    try:
        factor = backend.cholesky(block)
    except np.linalg.LinAlgError:
        raise InputError("AMG: the coarsest-level operator is not positive definite "
                         "(the matrix is not symmetric positive definite)") from None
    lower_inverse = backend.linalg.solve_triangular(factor, xp.eye(kept.size), lower=True)
    inverse = xp.zeros_like(dense)
    inverse[kept[:, None], kept[None, :]] = lower_inverse.T @ lower_inverse
    return inverse


def build_hierarchy(A, B, backend, *, theta=0.0, coarse_size=100, max_levels=10, lanczos_steps=10, reuse=None,
                    max_coarse_rows=4096):
    """Set up the smoothed-aggregation hierarchy of ``A`` with ``backend``'s arrays.

    Parameters
    ----------
    A : sparse CSR matrix of ``backend`` (SciPy or ``cupyx``)
        Symmetric positive definite, float64.
    B : array of shape (n, k), or None
        The near-nullspace (constants when None), an array of ``backend``.
    theta : float
        Strength threshold (0: every connection is strong).
    coarse_size : int
        Coarsening stops at this many nodes (rows of the finest level, groups of
        ``k`` rows below it).
    max_levels : int
        At most this many levels.
    lanczos_steps : int
        Lanczos steps of each ``rho(D^-1 A)`` estimate.
    reuse : list of LevelStructure, optional
        A previous hierarchy's :attr:`Hierarchy.structure` for a matrix of the same
        pattern: the aggregation and ``T`` are kept, the rest recomputed.
    max_coarse_rows : int
        The most rows the coarsest level's dense inverse may have.

    Returns
    -------
    Hierarchy
    """
    xp = backend.xp
    if B is None:
        B = xp.ones((A.shape[0], 1))
    k = B.shape[1]
    operators, prolongators, restrictions, structure, radii = [A], [], [], [], []
    block = 1
    while (len(structure) < len(reuse) if reuse is not None else (
            len(operators) < max_levels and A.shape[0] / block > coarse_size)):
        if reuse is not None:
            level = reuse[len(structure)]
        else:
            aggregates, count = aggregate(node_matrix(A, block, backend), theta, backend)
            if count == 0:  # every node isolated: nothing to coarsen
                break
            level = LevelStructure(aggregates, count, *tentative_prolongator(aggregates, count, block, B, backend))
        P, rho = smoothed_prolongator(A, level.tentative, lanczos_steps, backend)
        R = P.T.tocsr()
        A = backend.product(R, backend.product(A, P))
        operators.append(A)
        prolongators.append(P)
        restrictions.append(R)
        structure.append(level)
        radii.append(rho)
        B, block = level.coarse_candidates, k
    if A.shape[0] > max_coarse_rows:
        raise InputError(f"AMG coarsening stopped at {A.shape[0]:,} rows after {len(operators)} levels; the "
                         f"coarsest level's dense inverse takes at most {max_coarse_rows:,} rows: raise max_levels")
    return Hierarchy(operators, prolongators, restrictions, dense_pseudo_inverse(A, backend), structure, radii)


def build_on_device(A, B, backend=None, dtype=None, **options):
    """The hierarchy of ``A`` built with ``backend`` (the GPU's by default), its matrices where ``A`` is.

    Parameters
    ----------
    A : scipy.sparse or cupyx.scipy.sparse CSR matrix
        A host matrix is copied to the device for the set-up and the levels are
        copied back (for the CPU cycle); a device matrix's levels stay there.
    B : ndarray of shape (n, k), or None
        The near-nullspace (host array), None for constants.
    backend : DeviceBackend or ReferenceBackend, optional
        :func:`device_backend` when not given.
    dtype : numpy dtype, optional
        Precision of the levels (below the finest) and the coarsest inverse; ``A``'s
        by default. The set-up itself runs in float64.
    **options
        As :func:`build_hierarchy` takes them.

    Returns
    -------
    Hierarchy
    """
    from .base import jacobi_inverse_diagonal
    backend = device_backend() if backend is None else backend
    dtype, on_device = A.dtype if dtype is None else np.dtype(dtype), is_cupy_sparse(A)
    fine = backend.sparse.csr_matrix(A).astype(np.float64)
    jacobi_inverse_diagonal(fine.diagonal(), user="AMG")
    built = build_hierarchy(fine, None if B is None else backend.xp.asarray(B, dtype=np.float64), backend, **options)
    place = (lambda M: M.astype(dtype)) if on_device else (lambda M: backend.to_host(M.astype(dtype)))
    built.operators[1:] = [place(M) for M in built.operators[1:]]
    built.operators[0] = A
    built.prolongators[:] = [place(M) for M in built.prolongators]
    built.restrictions[:] = [place(M) for M in built.restrictions]
    built.coarse_inverse = place(built.coarse_inverse)
    return built
