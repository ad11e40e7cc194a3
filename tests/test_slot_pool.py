"""The CUDA backend's slot pools and the slabs they hand back (csrc/cuda/slot_pool.hpp),
driven over host memory on the CPU.

Slabs a pool lets go of are kept for later pools instead of freed (cudaFree synchronises
the device). A pool whose slabs launches left on the GPU may still write (a close that
abandoned them) must hand none of them to a later pool: review G5 found "leaked" slabs
returned to the keep by the pool's destructor anyway, so a later harvester's runners got
memory an old kernel still wrote. These tests count what the process keeps.
"""

from freeride import _C

T = _C._testing
STRIDE = 1024
BYTES = STRIDE * T.SLOTS_PER_SLAB


def kept() -> int:
    return T.kept_slabs(T.HOST_POOL_DEVICE, True, BYTES)


def test_released_slabs_are_kept_and_taken_again():
    before = kept()
    pool = T.HostSlotPool(STRIDE)
    for _ in range(T.SLOTS_PER_SLAB + 1):  # two slabs
        pool.acquire()
    assert pool.slabs == 2
    del pool
    assert kept() == before + 2
    again = T.HostSlotPool(STRIDE)
    again.acquire()
    assert kept() == before + 1  # taken from the keep, not allocated
    again.release_all()
    assert kept() == before + 2


def test_held_slabs_are_never_kept_until_released():
    """Held (launches left on the GPU may write them): neither release_all() nor the
    destructor hands them on; release_held() (the GPU has passed them) does."""
    pool = T.HostSlotPool(STRIDE)
    pool.acquire()  # (may take a slab an earlier test kept)
    before = kept()
    pool.hold()
    pool.release_all()
    assert kept() == before and pool.slabs == 1
    pool.release_held()
    assert kept() == before + 1 and pool.slabs == 0 and not pool.held


def test_a_held_pool_destroyed_leaks_its_slabs():
    pool = T.HostSlotPool(STRIDE)
    pool.acquire()
    before = kept()
    pool.hold()
    del pool
    assert kept() == before
