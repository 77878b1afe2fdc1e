"""Test problems generated on the fly (never stored as files)."""
import numpy as np
import scipy.sparse as sp


def _laplacian(shape, weights, dtype):
    """Finite-difference Laplacian on a ``shape`` grid, axis ``k`` coupled with ``weights[k]``.

    Built from its diagonals (fast even for tens of millions of rows):
    ``2 * sum(w)`` on the diagonal, ``-w_k`` to each neighbour along axis k
    that lies inside the grid (Dirichlet walls).
    """
    shape = tuple(int(m) for m in shape)
    n = int(np.prod(shape))
    offsets, diags = [0], [np.full(n, 2.0 * sum(weights))]
    stride = 1
    for axis in reversed(range(len(shape))):  # C order: the last axis has stride 1
        m, w = shape[axis], weights[axis]
        if m > 1:
            coupled = np.ones(n - stride)
            # no coupling across the wall between the last point of one line and the first of the next
            coupled[(np.arange(n - stride) // stride) % m == m - 1] = 0.0
            offsets += [stride, -stride]
            diags += [-w * coupled, -w * coupled]
        stride *= m
    A = sp.diags(diags, offsets, shape=(n, n), format="csr", dtype=dtype)
    A.eliminate_zeros()
    A.sort_indices()
    return A


def poisson(shape, dtype=np.float64):
    """Finite-difference Laplacian (5-point in 2-D, 7-point in 3-D) with Dirichlet walls.

    Parameters
    ----------
    shape : tuple of int
        Grid points per dimension, e.g. ``(64, 64)`` or ``(64, 64, 64)``.

    Returns
    -------
    scipy.sparse.csr_matrix
        SPD matrix of size ``prod(shape)``.
    """
    return _laplacian(shape, [1.0] * len(shape), dtype)


def periodic_poisson(shape, shift=1e-2, dtype=np.float64):
    """Finite-difference Laplacian on a torus (periodic walls), plus ``shift`` on the diagonal.

    Each point is coupled (``-1``) to its two neighbours along every axis of more
    than two points, the last point of a line to the first; the diagonal holds
    the couplings' count plus ``shift``, which makes the matrix SPD (the plain
    periodic Laplacian is singular). In C order the wrap-around couplings lie off
    the stencil's diagonals: a few entries of each line's ends.

    Parameters
    ----------
    shape : tuple of int
        Grid points per dimension.
    shift : float
        Added to the diagonal (positive).
    """
    shape = tuple(int(m) for m in shape)
    if shift <= 0:
        raise ValueError(f"shift must be positive, not {shift}")
    n = int(np.prod(shape))
    idx = np.arange(n).reshape(shape)
    rows, cols = [], []
    for axis, m in enumerate(shape):
        if m > 2:  # two points would couple twice to the same neighbour
            rows.append(idx.ravel())
            cols.append(np.roll(idx, -1, axis=axis).ravel())
    rows = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    cols = np.concatenate(cols) if cols else np.zeros(0, dtype=np.int64)
    W = sp.coo_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n))
    W = (W + W.T).tocsr()
    A = sp.diags(np.asarray(W.sum(axis=1)).ravel() + shift) - W
    A = sp.csr_matrix(A, dtype=dtype)
    A.sort_indices()
    return A


def anisotropic_diffusion(shape, eps=1e-3, dtype=np.float64):
    """Laplacian whose first-axis coupling is scaled by ``eps`` (hard for Jacobi)."""
    return _laplacian(shape, [eps] + [1.0] * (len(shape) - 1), dtype)


def _graph_laplacian(n, rows, cols, shift, dtype):
    """``D - W + shift (D + I)`` of the undirected graph with edges ``(rows[k], cols[k])``.

    Unit weights; duplicate edges and self loops dropped. The diagonal shift makes the
    Laplacian (singular: constants are in its null space) positive definite, isolated
    vertices included.
    """
    keep = rows != cols
    i, j = np.minimum(rows[keep], cols[keep]), np.maximum(rows[keep], cols[keep])
    W = sp.coo_matrix((np.ones(i.size), (i, j)), shape=(n, n)).tocsr()
    W.data[:] = 1.0  # duplicates were summed
    W = W + W.T
    degree = np.asarray(W.sum(axis=1)).ravel()
    A = sp.diags(degree * (1.0 + shift) + shift) - W
    A = sp.csr_matrix(A, dtype=dtype)
    A.sort_indices()
    return A


def random_geometric_laplacian(n, degree=14.0, shift=1e-2, seed=0, dtype=np.float64):
    """Laplacian of a 3-D random geometric graph, rows numbered in random order.

    ``n`` points uniform in the unit cube, joined when closer than the radius
    that gives ``degree`` neighbours on average (a mesh without a grid, as from
    an unstructured finite-element or particle code, with no locality in the
    numbering). ``shift`` as in ``D - W + shift (D + I)``.

    Returns
    -------
    scipy.sparse.csr_matrix
    """
    from scipy.spatial import cKDTree

    points = np.random.default_rng(seed).random((int(n), 3))
    radius = (3.0 * degree / (4.0 * np.pi * n)) ** (1.0 / 3.0)
    pairs = cKDTree(points).query_pairs(radius, output_type="ndarray")
    return _graph_laplacian(int(n), pairs[:, 0], pairs[:, 1], shift, dtype)


def power_law_laplacian(n, exponent=2.6, min_degree=2, hub_fraction=0.888, shift=1e-2, seed=0,
                        dtype=np.float64):
    """Laplacian of a graph with power-law degrees and one hub joined to most vertices.

    Degrees drawn from a Pareto law (``P(d) ~ d^-exponent``, at least ``min_degree``),
    wired by random stub matching (configuration model); vertex 0 is then joined to a
    random ``hub_fraction`` of the others, so its row is nearly dense (a social or web
    graph's celebrity). Rows are numbered in random order. ``shift`` as for
    :func:`random_geometric_laplacian`.
    """
    rng = np.random.default_rng(seed)
    n = int(n)
    degrees = np.minimum(np.floor(min_degree * (1.0 - rng.random(n)) ** (-1.0 / (exponent - 1.0))),
                         n - 1).astype(np.int64)
    stubs = rng.permutation(np.repeat(np.arange(n), degrees))
    stubs = stubs[: stubs.size // 2 * 2].reshape(-1, 2)
    hub = np.zeros(int(hub_fraction * (n - 1)), dtype=np.int64)
    spokes = 1 + rng.choice(n - 1, size=hub.size, replace=False)
    rows = np.concatenate([stubs[:, 0], hub])
    cols = np.concatenate([stubs[:, 1], spokes])
    order = rng.permutation(n)  # random numbering: the hub is not row 0
    return _graph_laplacian(n, order[rows], order[cols], shift, dtype)


def stencil27(shape, dtype=np.float64):
    """27-point Laplacian on a 3-D grid (each point coupled to its 26 neighbours), Dirichlet walls.

    ``26`` on the diagonal and ``-1`` to every neighbour inside the grid: the sparsity of
    trilinear (Q1) hexahedral finite elements on a structured mesh.
    """
    nx, ny, nz = (int(m) for m in shape)
    n = nx * ny * nz
    idx = np.arange(n).reshape(nx, ny, nz)
    rows, cols = [], []
    for dx in (-1, 0, 1):
        for dy in (-1, 0, 1):
            for dz in (-1, 0, 1):
                if dx == dy == dz == 0:
                    continue
                src = idx[max(0, -dx):nx - max(0, dx), max(0, -dy):ny - max(0, dy), max(0, -dz):nz - max(0, dz)]
                dst = idx[max(0, dx):nx - max(0, -dx) or None, max(0, dy):ny - max(0, -dy) or None,
                          max(0, dz):nz - max(0, -dz) or None]
                rows.append(src.ravel())
                cols.append(dst.ravel())
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    A = sp.coo_matrix((np.full(rows.size, -1.0), (rows, cols)), shape=(n, n)) + sp.diags(np.full(n, 26.0))
    A = sp.csr_matrix(A, dtype=dtype)
    A.sort_indices()
    return A


def variable_diffusion(k, dtype=np.float64):
    """Finite-volume ``-div(k grad u)`` on a 2-D grid of cells with coefficients ``k`` (Dirichlet walls).

    Neighbouring cells i, j are coupled by the harmonic mean ``2 k_i k_j / (k_i + k_j)``;
    a wall face adds ``2 k_i`` to its cell's diagonal (the wall half a cell away). SPD
    for positive ``k``; ``k`` of shape ``(nx, ny)`` gives ``nx * ny`` unknowns.
    """
    k = np.asarray(k, dtype=np.float64)
    nx, ny = k.shape
    idx = np.arange(nx * ny).reshape(nx, ny)
    diag = np.zeros((nx, ny))
    rows, cols, vals = [], [], []
    for axis in (0, 1):
        a = [slice(None)] * 2
        b = [slice(None)] * 2
        a[axis], b[axis] = slice(0, -1), slice(1, None)
        ka, kb = k[tuple(a)], k[tuple(b)]
        w = 2.0 * ka * kb / (ka + kb)
        diag[tuple(a)] += w
        diag[tuple(b)] += w
        rows += [idx[tuple(a)].ravel(), idx[tuple(b)].ravel()]
        cols += [idx[tuple(b)].ravel(), idx[tuple(a)].ravel()]
        vals += [-w.ravel(), -w.ravel()]
        for edge in (0, -1):  # wall faces
            e = [slice(None)] * 2
            e[axis] = edge
            diag[tuple(e)] += 2.0 * k[tuple(e)]
    rows.append(idx.ravel())
    cols.append(idx.ravel())
    vals.append(diag.ravel())
    A = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(nx * ny, nx * ny), dtype=dtype)
    A.sum_duplicates()
    A.sort_indices()
    return A


def rotated_anisotropic_diffusion(shape, epsilon=1e-3, theta=np.pi / 6, dtype=np.float64):
    """``-div(K grad u)`` with ``K`` anisotropic by ``epsilon`` along axes rotated by ``theta`` (needs PyAMG).

    Bilinear finite elements on a 2-D grid of ``shape`` interior points, Dirichlet
    walls: PyAMG's ``stencil_grid(diffusion_stencil_2d(epsilon, theta), shape)``.
    The strong coupling runs at ``theta`` to the grid, so neither Jacobi nor
    line smoothing follows it: Jacobi-PCG iterations grow with the grid
    (about 700 at 128^2, 2,800 at 512^2, rtol 1e-8) while smoothed-aggregation
    AMG's stay near 50.

    Returns
    -------
    scipy.sparse.csr_matrix
        SPD, 9 nonzeros a row inside the grid.
    """
    from .pcg.preconditioners.amg import require_pyamg

    gallery = require_pyamg().gallery
    stencil = gallery.diffusion_stencil_2d(epsilon=epsilon, theta=theta)
    A = sp.csr_matrix(gallery.stencil_grid(stencil, tuple(int(m) for m in shape), format="csr"), dtype=dtype)
    A.sort_indices()
    return A


def linear_elasticity_2d(shape, young=1e5, poisson_ratio=0.3, dtype=np.float64):
    """Plane-strain linear elasticity on a 2-D grid of bilinear elements, and its rigid body modes (needs PyAMG).

    PyAMG's ``gallery.linear_elasticity(shape, E=young, nu=poisson_ratio)``: ``shape``
    interior nodes, the walls clamped (Dirichlet), two unknowns a node (x and y
    displacement, interleaved). Jacobi-PCG needs about 250 iterations at 64^2 and
    1,300 at 512^2 (rtol 1e-8); AMG with the rigid body modes 12 at 64^2.

    Returns
    -------
    (scipy.sparse.csr_matrix, ndarray)
        The SPD stiffness matrix and the near-nullspace ``B`` of shape ``(n, 3)``:
        the two translations and the rotation, what AMG's prolongators must
        reproduce (pass it as ``AMG(near_nullspace=B)`` or ``--nullspace``).
    """
    from .pcg.preconditioners.amg import require_pyamg

    A, B = require_pyamg().gallery.linear_elasticity(tuple(int(m) for m in shape), E=young, nu=poisson_ratio)
    A = sp.csr_matrix(A, dtype=dtype)
    A.sort_indices()
    return A, np.asarray(B, dtype=np.float64)
