"""Does the driver's occupancy answer (cuOccupancyMaxActiveBlocksPerMultiprocessor) read a
function's preferred shared-memory carveout? (review of the G9 change, 2026-11-27, L1)

    python3 probe_occupancy_carveout.py

freeride's CUDA backend asks a kernel's occupancy once per harvester and sets the
kernel's preferred carveout only where it changes (csrc/cuda/launch_shapes.hpp); a set
has the occupancy asked once more, because CUDA does not document whether that answer
depends on the carveout the function prefers (the occupancy calculator of
cuda_occupancy.h does take a carveout). Here: a kernel with 40 KiB of static shared
memory, 128 threads a block, whose occupancy shared memory limits; its occupancy asked
with no carveout set, then with 0, 25, 50 and 100 percent set. Nothing of freeride runs:
CuPy compiles and loads the kernel, ctypes calls the driver.

ANSWER line: "yes" (the answers differ with the carveout: the cache must ask again after
a set, as it does), "no" (they are all the same: asking again costs one query per set),
or "undetermined" (a call failed).
"""

from __future__ import annotations

import ctypes

from _probe import answer, result

NAME = "probe_occupancy_carveout"
CARVEOUT = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
THREADS = 128
SOURCE = r"""
extern "C" __global__ void shared_heavy(float* out) {
  __shared__ float buf[10240];  // 40 KiB
  buf[threadIdx.x] = threadIdx.x;
  __syncthreads();
  out[blockIdx.x] = buf[(threadIdx.x + 1) % blockDim.x];
}
"""


def main() -> None:
    import cupy

    function = cupy.RawModule(code=SOURCE).get_function("shared_heavy")
    # get_function gives a RawKernel; its CUfunction is the .kernel Function's pointer
    # (as freeride's own tasks/_kernel_cache.py reads it).
    handle = ctypes.c_void_p(getattr(function, "kernel", function).ptr)
    driver = ctypes.CDLL("libcuda.so.1")

    def occupancy() -> int:
        blocks = ctypes.c_int(0)
        err = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(blocks), handle, ctypes.c_int(THREADS), ctypes.c_size_t(0)
        )
        if err != 0:
            raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor: CUresult {err}")
        return blocks.value

    answers = {"unset": occupancy()}
    for percent in (0, 25, 50, 100):
        err = driver.cuFuncSetAttribute(handle, ctypes.c_int(CARVEOUT), ctypes.c_int(percent))
        if err != 0:
            raise RuntimeError(f"cuFuncSetAttribute(carveout={percent}): CUresult {err}")
        answers[f"{percent}%"] = occupancy()
    device = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    result(
        NAME,
        f"{device['name'].decode()}: blocks per SM of a {THREADS}-thread, 40 KiB-shared "
        "kernel, by preferred carveout: "
        + ", ".join(f"{key} {value}" for key, value in answers.items()),
    )
    answer(NAME, "yes" if len(set(answers.values())) > 1 else "no")


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # noqa: BLE001 - the answer says so
        result(NAME, f"failed: {type(exc).__name__}: {exc}")
        answer(NAME, "undetermined")
