"""What a system spread over several clusters would pay an iteration for its reductions.

Run on a GPU machine::

    python scripts/probe_multicluster.py [--iterations 20000]

Prints, for clusters of 16 and of 8 blocks of 512 threads: how many such clusters the GPU holds at
once (``cuOccupancyMaxActiveClusters``), whether a cooperative launch accepts a kernel with
compile-time cluster dimensions, and the time a loop iteration takes for (a) a cluster barrier only,
(b) a cluster barrier, then the clusters' rank-0 blocks arriving on one global counter that every
block polls, (c) every block arriving on one global counter (the grid path's reduction, no cluster
barrier). Nothing here is used by the solvers; it sizes a design before it is built.
"""
import argparse
import time

import cupy
import numpy as np

SOURCE = r"""
__device__ __forceinline__ unsigned int load_acquire(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void add_release(unsigned int* p, unsigned int v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned rank() {
    unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
// MODE 0: cluster barrier; 1: cluster barrier + rank 0 arrives on the counter, all poll; 2: all arrive
extern "C" __global__ void __cluster_dims__(TEAM, 1, 1) __launch_bounds__(512, 1)
probe(unsigned int* counter, int iterations, int mode, double* out) {
    extern __shared__ double pad[];
    const unsigned groups = gridDim.x / TEAM;
    double acc = threadIdx.x;
    for (int i = 1; i <= iterations; ++i) {
        acc = acc * 0.5 + 1.0;
        if (mode <= 1) cluster_sync();
        else __syncthreads();
        if (mode >= 1) {
            if (threadIdx.x == 0) {
                const bool arrive = mode == 2 || rank() == 0;
                if (arrive) add_release(counter, 1u);
                const unsigned target = (unsigned)i * (mode == 2 ? gridDim.x : groups);
                while ((int)(load_acquire(counter) - target) < 0) {}
            }
            __syncthreads();
        }
    }
    if (threadIdx.x == 0) out[blockIdx.x] = acc + pad[0] * 0;
}
"""


def max_active_clusters(function, team, block, shared):
    from cuda.bindings import driver
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = team * 16, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
    config.sharedMemBytes = shared
    attr = driver.CUlaunchAttribute()
    attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = team, 1, 1
    config.attrs = [attr]
    config.numAttrs = 1
    err, count = driver.cuOccupancyMaxActiveClusters(driver.CUfunction(function.ptr), config)
    return count if err == driver.CUresult.CUDA_SUCCESS else f"error {err}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20000)
    args = parser.parse_args()
    print("| team | shared KB | max active clusters | cooperative launch | clusters | (a) cluster us | "
          "(b) + cross-cluster counter us | (c) all blocks on one counter us |")
    print("|---|---|---|---|---|---|---|---|")
    for team in (16, 8):
        mod = cupy.RawModule(code=SOURCE, options=("-std=c++17", f"-DTEAM={team}"))
        kernel = mod.get_function("probe")
        function = kernel.kernel
        if team > 8:
            cupy.cuda.driver.funcSetAttribute(function.ptr, 14, 1)
        for shared in (100 * 1024, 200 * 1024):
            kernel.max_dynamic_shared_size_bytes = shared
            active = max_active_clusters(function, team, 512, shared)
            groups = active if isinstance(active, int) else 132 // team
            out = cupy.zeros(groups * team)
            try:
                function((groups * team,), (512,), (cupy.zeros(1, dtype=cupy.uint32), np.int32(10), np.int32(0), out),
                         shared_mem=shared, enable_cooperative_groups=True)
                cupy.cuda.Device().synchronize()
                coop = "accepted"
            except Exception as exc:  # noqa: BLE001 - the probe reports what the driver says
                coop = f"refused ({type(exc).__name__}: {str(exc)[:60]})"
            times = []
            for mode in (0, 1, 2):
                counter = cupy.zeros(1, dtype=cupy.uint32)
                kernel((groups * team,), (512,), (counter, np.int32(100), np.int32(mode), out), shared_mem=shared)
                cupy.cuda.Device().synchronize()
                counter[...] = 0
                start = time.perf_counter()
                kernel((groups * team,), (512,), (counter, np.int32(args.iterations), np.int32(mode), out),
                       shared_mem=shared)
                cupy.cuda.Device().synchronize()
                times.append((time.perf_counter() - start) / args.iterations * 1e6)
            print(f"| {team} | {shared // 1024} | {active} | {coop} | {groups} | {times[0]:.2f} | {times[1]:.2f} | "
                  f"{times[2]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
