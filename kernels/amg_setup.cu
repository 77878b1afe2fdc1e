// Smoothed-aggregation AMG set-up on the device: strength of connection, MIS(2) aggregation
// (Bell, Dalton and Olson, SIAM J. Sci. Comput. 34(4), 2012) and the tentative prolongator's
// per-aggregate QR. NumPy meaning: amg_setup_ref.py. Every kernel writes only its own thread's
// outputs from inputs no thread writes, so the result does not depend on the order threads run in.
//
// A node's MIS key packs (state, hash, index) into 64 bits so that comparing keys compares the
// tuples: state in bits 62-63 (OUT < UNDECIDED < ROOT), a seeded 30-bit hash of the index in bits
// 32-61 (the random priority), the index in bits 0-31 (ties).

#define MIS_OUT 0ull
#define MIS_UNDECIDED 1ull
#define MIS_ROOT 2ull
#define MIS_STATE(key) ((key) >> 62)
#define MIS_INDEX(key) ((int)((key) & 0xffffffffull))
#define MIS_WITHOUT_STATE 0x3fffffffffffffffull

__device__ __forceinline__ unsigned int node_hash(unsigned int i, unsigned int seed) {
    unsigned int h = i * 0x9E3779B1u ^ seed;  // MurmurHash3's 32-bit finaliser of a spread index
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    return h;
}

// strong[e] for entry e = (i, j) of the CSR matrix: off the diagonal, nonzero and a_ij^2 >= theta^2 |d_i d_j|
// (PyAMG's symmetric strength of connection; a stored zero, which SpGEMM keeps and SciPy drops, is no
// connection).
extern "C" __global__ void strong_connections(int n, const int* __restrict__ indptr, const int* __restrict__ indices,
                                              const double* __restrict__ values, const double* __restrict__ diagonal,
                                              double theta_squared, unsigned char* __restrict__ strong) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const double di = fabs(diagonal[i]);
        for (int e = indptr[i]; e < indptr[i + 1]; ++e) {
            const int j = indices[e];
            const double a = values[e];
            strong[e] = (j != i) && (a != 0.0) && (a * a >= theta_squared * di * fabs(diagonal[j]));
        }
    }
}

// The first keys: undecided for a node with a strong neighbour, out for an isolated one (left
// unaggregated, as PyAMG leaves it).
extern "C" __global__ void mis_initial_keys(int n, const int* __restrict__ indptr,
                                            const unsigned char* __restrict__ strong, unsigned int seed,
                                            unsigned long long* __restrict__ keys) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        unsigned long long state = MIS_OUT;
        for (int e = indptr[i]; e < indptr[i + 1]; ++e) {
            if (strong[e]) {
                state = MIS_UNDECIDED;
                break;
            }
        }
        keys[i] = (state << 62) | ((unsigned long long)(node_hash((unsigned int)i, seed) & 0x3fffffffu) << 32) |
                  (unsigned long long)(unsigned int)i;
    }
}

// out[i] = the largest key among i and its strong neighbours (twice: over distance 2).
extern "C" __global__ void neighbourhood_max(int n, const int* __restrict__ indptr, const int* __restrict__ indices,
                                             const unsigned char* __restrict__ strong,
                                             const unsigned long long* __restrict__ in,
                                             unsigned long long* __restrict__ out) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        unsigned long long m = in[i];
        for (int e = indptr[i]; e < indptr[i + 1]; ++e) {
            if (strong[e]) {
                const unsigned long long k = in[indices[e]];
                m = k > m ? k : m;
            }
        }
        out[i] = m;
    }
}

// An undecided node whose distance-2 neighbourhood's largest key is its own becomes a root; one
// that sees a root within distance 2 is out. reach = the distance-2 maxima of keys.
extern "C" __global__ void mis_decide(int n, const unsigned long long* __restrict__ reach,
                                      unsigned long long* __restrict__ keys) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const unsigned long long key = keys[i];
        if (MIS_STATE(key) != MIS_UNDECIDED) continue;
        const unsigned long long m = reach[i];
        if (MIS_INDEX(m) == i) {
            keys[i] = (MIS_ROOT << 62) | (key & MIS_WITHOUT_STATE);
        } else if (MIS_STATE(m) == MIS_ROOT) {
            keys[i] = key & MIS_WITHOUT_STATE;
        }
    }
}

// A root's aggregate is its number among the roots; a node next to a root joins it (roots lie at
// least 3 apart, so there is at most one); any other node is -1 here.
extern "C" __global__ void join_roots(int n, const int* __restrict__ indptr, const int* __restrict__ indices,
                                      const unsigned char* __restrict__ strong,
                                      const unsigned long long* __restrict__ keys,
                                      const int* __restrict__ root_number, int* __restrict__ aggregate) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        int a = -1;
        if (MIS_STATE(keys[i]) == MIS_ROOT) {
            a = root_number[i];
        } else {
            for (int e = indptr[i]; e < indptr[i + 1]; ++e) {
                const int j = indices[e];
                if (strong[e] && MIS_STATE(keys[j]) == MIS_ROOT) {
                    a = root_number[j];
                    break;
                }
            }
        }
        aggregate[i] = a;
    }
}

// A node not yet aggregated joins the aggregate of largest number among its strong neighbours'
// (those of join_roots); an isolated node stays at -1.
extern "C" __global__ void join_neighbours(int n, const int* __restrict__ indptr, const int* __restrict__ indices,
                                           const unsigned char* __restrict__ strong, const int* __restrict__ first,
                                           int* __restrict__ aggregate) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        int a = first[i];
        if (a < 0) {
            for (int e = indptr[i]; e < indptr[i + 1]; ++e) {
                const int b = first[indices[e]];
                if (strong[e] && b > a) a = b;
            }
        }
        aggregate[i] = a;
    }
}

// Modified Gram-Schmidt of each aggregate's block of the near-nullspace (PyAMG's fit_candidates):
// q holds the aggregates' rows one after another (rows offsets[a] to offsets[a+1] - 1, k values
// each) and becomes Q; r[a] (k x k, row-major) becomes R. A column whose norm after
// orthogonalisation is at most tol times its norm before is set to zero, with R's diagonal entry.
extern "C" __global__ void fit_candidates(int aggregates, int k, const int* __restrict__ offsets,
                                          double* __restrict__ q, double* __restrict__ r, double tol) {
    for (int a = blockIdx.x * blockDim.x + threadIdx.x; a < aggregates; a += gridDim.x * blockDim.x) {
        const int first = offsets[a], last = offsets[a + 1];
        double* ra = r + (long long)a * k * k;
        for (int e = 0; e < k * k; ++e) ra[e] = 0.0;
        for (int j = 0; j < k; ++j) {
            double norm = 0.0;
            for (int p = first; p < last; ++p) norm += q[(long long)p * k + j] * q[(long long)p * k + j];
            const double threshold = tol * sqrt(norm);
            for (int c = 0; c < j; ++c) {
                double dot = 0.0;
                for (int p = first; p < last; ++p) dot += q[(long long)p * k + c] * q[(long long)p * k + j];
                for (int p = first; p < last; ++p) q[(long long)p * k + j] -= dot * q[(long long)p * k + c];
                ra[c * k + j] = dot;
            }
            norm = 0.0;
            for (int p = first; p < last; ++p) norm += q[(long long)p * k + j] * q[(long long)p * k + j];
            norm = sqrt(norm);
            const double scale = norm > threshold ? 1.0 / norm : 0.0;
            ra[j * k + j] = norm > threshold ? norm : 0.0;
            for (int p = first; p < last; ++p) q[(long long)p * k + j] *= scale;
        }
    }
}

// The smoothed prolongator P = T - D^-1 (A T) scaled, formed in place on the pattern of X = A T:
// X's entries of row i are multiplied by factor[i] (minus the Jacobi weight over the diagonal),
// then T's entries of row i are added where X holds their column (it always does: A's diagonal is
// stored, so row i of A T has every column of row i of T).
extern "C" __global__ void smooth_prolongator(int n, const int* __restrict__ x_indptr,
                                              const int* __restrict__ x_indices, double* __restrict__ x_values,
                                              const double* __restrict__ factor, const int* __restrict__ t_indptr,
                                              const int* __restrict__ t_indices, const double* __restrict__ t_values) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const double f = factor[i];
        for (int e = x_indptr[i]; e < x_indptr[i + 1]; ++e) x_values[e] *= f;
        for (int t = t_indptr[i]; t < t_indptr[i + 1]; ++t) {
            const int c = t_indices[t];
            for (int e = x_indptr[i]; e < x_indptr[i + 1]; ++e) {
                if (x_indices[e] == c) {
                    x_values[e] += t_values[t];
                    break;
                }
            }
        }
    }
}
