"""The reserve side kernels leave free on every SM, and the time slice of every launch:
the host tests.

They check the occupancy arithmetic against figures worked out by hand for an H100 (and
against the occupancy calculator's rules, written out independently), the validation of
the Reserve's and the Harvester's arguments, and the green-context planning (how many SMs
to ask the driver for, and when to fall back to the occupancy cap). What the reserve and
the slice do on a GPU is tested in test_reserve_gpu.py.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import freeride as fr
from freeride import _C
from freeride.reserve import NO_RESERVE

# SMs as sm_limits reads them: threads, blocks, registers, shared memory (largest
# carveout), the shared memory the system reserves per block, warp size, and compute
# capability (which sets the allocation units and sub-partitions, as cuda_occupancy.h).
H100 = (2048, 32, 65536, 233472, 1024, 32, 90)
A100 = (2048, 32, 65536, 167936, 1024, 32, 80)
V100 = (2048, 32, 65536, 98304, 0, 32, 70)
DEFAULT = fr.Reserve().as_tuple()
NONE = (0, 1, 0, 0)
GREEN = fr.Reserve(mechanism="green-context")


def blocks(use, reserve=DEFAULT, sm=H100):
    return _C.side_blocks_per_sm(sm, reserve, use)[0]


def test_default_reserve_is_one_nccl_class_block():
    assert DEFAULT == (1, 512, 64, 48 * 1024)


def test_without_reserve_threads_and_registers_bound_the_blocks():
    assert blocks((128, 18, 0), NONE) == 16  # 64 warp slots / 4
    assert blocks((256, 64, 0), NONE) == 4  # 8 warps of 2048 registers per sub-partition / 8
    assert blocks((32, 8, 0), NONE) == 32  # the SM's block limit


def test_blocks_take_whole_warps():
    # 48 threads are two warp slots: the reserve's 16 warps leave 48, room for 24 blocks
    # (counting threads, 1536 / 48 = 32 would leave the reserve no slot).
    assert blocks((48, 0, 0)) == 24
    assert blocks((33, 0, 0), NONE) == 32  # 2 warps each: 32 blocks by warps, the block cap too
    assert blocks((48, 0, 0), (1, 48, 0, 0)) == 31  # beside one 2-warp block


def test_registers_come_from_one_sub_partition():
    # 40 registers x 32 lanes = 1280 per warp. The reserve's 16 warps of 2048 registers
    # take 4 warps' worth in each of the 4 sub-partitions of 16384: 8192 left in each
    # holds 6 side warps, 24 in all (the SM's 32768 free registers would suggest 25).
    assert blocks((32, 40, 0)) == 24
    # Without a reserve: 16384 / 1280 = 12 warps per sub-partition, 48 in all, 24 blocks
    # of 2 warps (65536 / 2560 = 25 counting the SM as one pool).
    assert blocks((64, 40, 0), NONE) == 24
    # 96 registers: 3072 per warp, 2 beside the reserve in each sub-partition: 4 blocks.
    assert blocks((64, 96, 0)) == 4


def test_reserve_takes_threads_registers_and_shared_memory():
    # Spin: 128 threads of 18 registers (23 with nvcc 13.0 for sm_90: the same 768 per
    # warp once rounded). Beside the reserve's
    # 16 warps 48 slots are left (12 blocks), but each sub-partition holds 10 more warps
    # of 768 registers in the 8192 the reserve leaves it: 40 warps, 10 blocks.
    assert blocks((128, 18, 0)) == 10
    # By warp slots alone: 48 free slots hold 12 blocks of 4 warps.
    assert blocks((128, 0, 0)) == 12
    # By shared memory: 233472 - (49152 + 1024) = 183296 free, 65 KiB blocks: 2 fit.
    assert blocks((32, 0, 65 * 1024)) == 2
    # 40000 + 1024 rounded to 128 bytes is 41088: 4 in 183296.
    assert blocks((32, 0, 40000)) == 4
    # Two reserved blocks take 32 warps and every register at 64 per thread.
    assert blocks((128, 16, 0), (2, 512, 64, 0)) == 0


def test_shared_memory_unit_follows_the_architecture():
    # Volta allocates shared memory in 256 bytes (10800 -> 11008: 8 in 96 KiB), Ampere in
    # 128 (10800 + 1024 reserved -> 11904: 14 in 164 KiB).
    assert blocks((32, 0, 10800), NONE, V100) == 8
    assert blocks((32, 0, 10800), NONE, A100) == 14
    # No system reservation before Ampere: a block without shared memory holds none.
    assert blocks((32, 0, 0), NONE, V100) == 32


def test_a_block_too_big_to_sit_beside_the_reserve_gets_no_slot():
    assert blocks((1024, 64, 0)) == 0
    assert blocks((1024, 64, 0), NONE) == 1


def test_a_reserve_that_does_not_fit_alone_leaves_nothing():
    assert blocks((32, 0, 0), (1, 512, 255, 0)) == 0  # 8192 registers per warp, 4 per slice
    assert blocks((32, 0, 0), (5, 512, 0, 0)) == 0  # 80 warps
    assert blocks((32, 0, 0), (1, 32, 0, 240 * 1024)) == 0


def test_carveout_keeps_the_reserve_shared_memory_configured():
    n, percent = _C.side_blocks_per_sm(H100, DEFAULT, (128, 18, 0))
    # 10 side blocks of 1 KiB (the system's share) plus 49 KiB reserved: 60416 of 233472.
    assert (n, percent) == (10, 26)
    _, without = _C.side_blocks_per_sm(H100, NONE, (128, 18, 0))
    assert without < percent


# The occupancy calculator's rules (cuda_occupancy.h), written out independently of the
# extension: per-architecture units, and what a set of resident blocks takes of an SM.
def _units(cc):
    major, minor = divmod(cc, 10)
    register_unit = 256  # cudaOccRegAllocationGranularity
    sub_partitions = 2 if (major, minor) == (6, 0) else 4  # cudaOccSubPartitionsPerMultiprocessor
    shared_unit = 256 if major <= 7 else 128  # cudaOccSMemAllocationGranularity
    return register_unit, sub_partitions, shared_unit


def _round_up(value, unit):
    return -(-value // unit) * unit


def _block(sm, threads, registers, shared):
    """(warps, registers per warp, shared bytes) one resident block holds."""
    _, _, _, _, reserved, warp, cc = sm
    register_unit, _, shared_unit = _units(cc)
    return (
        -(-threads // warp),
        _round_up(registers * warp, register_unit),
        _round_up(shared + reserved, shared_unit),
    )


def _fits(sm, reserve, use, side):
    """Whether `side` blocks of `use` and the reserve are resident on one SM together:
    warp slots, blocks, shared memory, and registers per sub-partition, with the side
    warps spread evenly and each reserved block's warps rounded up to a multiple of the
    sub-partitions (the hardware's per-block register check)."""
    threads, max_blocks, registers, shared, _, warp, cc = sm
    _, parts, _ = _units(cc)
    n = reserve[0]
    r_warps, r_regs, r_shared = _block(sm, *reserve[1:])
    s_warps, s_regs, s_shared = _block(sm, *use)
    return (
        n + side <= max_blocks
        and n * r_warps + side * s_warps <= threads // warp
        and n * -(-r_warps // parts) * r_regs + -(-side * s_warps // parts) * s_regs
        <= registers // parts
        and n * r_shared + side * s_shared <= shared
    )


def _occupancy(sm, use):
    """cudaOccMaxActiveBlocksPerMultiprocessor's warp, block, register and shared memory
    limits, for a block the calculator accepts."""
    threads, max_blocks, registers, shared, _, warp, cc = sm
    _, parts, _ = _units(cc)
    warps, regs, smem = _block(sm, *use)
    limit = min(threads // warp // warps, max_blocks, shared // smem if smem else max_blocks)
    if regs:
        limit = min(limit, registers // parts // regs * parts // warps)
    return limit


SMS = st.sampled_from([H100, A100, V100])
USES = st.tuples(st.integers(1, 1024), st.integers(0, 255), st.integers(0, 100 * 1024))
RESERVES_ = st.tuples(
    st.integers(0, 4), st.integers(1, 1024), st.integers(0, 255), st.integers(0, 64 * 1024)
)


@settings(max_examples=1000, deadline=None)
@given(sm=SMS, reserve=RESERVES_, use=USES)
def test_side_blocks_and_reserve_fit_together_and_no_more_would(sm, reserve, use):
    side, percent = _C.side_blocks_per_sm(sm, reserve, use)
    if side == 0:
        assert not _fits(sm, reserve, use, 1)
        return
    assert _fits(sm, reserve, use, side)
    assert not _fits(sm, reserve, use, side + 1)
    # The carveout the driver makes of the percent (rounded down) holds them all.
    needed = reserve[0] * _block(sm, *reserve[1:])[2] + side * _block(sm, *use)[2]
    assert percent * sm[3] // 100 >= needed


@settings(max_examples=500, deadline=None)
@given(sm=SMS, use=USES)
def test_without_a_reserve_the_count_is_the_occupancy_calculators(sm, use):
    assert blocks(use, NONE, sm) == _occupancy(sm, use)


def test_item_ctx_layout_matches_the_signature_check():
    from freeride.tasks._signature import CTX_BYTES

    # gate, state, progress and end record; n_items, phase, slice_ns and launch number;
    # the launch's own counters and the closes word, and the closes at launch; the phase
    # before's done count and items (a launch chained at an open); the items of each phase
    # (device phases); the ordinal of the close after the launch's open (4 bytes, padded).
    assert CTX_BYTES == _C.ITEM_CTX_BYTES == 120


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"blocks": -1}, ValueError, "reserve.blocks"),
        ({"blocks": 33}, ValueError, "reserve.blocks"),
        ({"threads": 0}, ValueError, "reserve.threads"),
        ({"threads": 1025}, ValueError, "reserve.threads"),  # no CUDA block is larger
        ({"registers_per_thread": 256}, ValueError, "reserve.registers_per_thread"),
        ({"shared_memory": "lots"}, ValueError, "reserve.shared_memory"),
        ({"shared_memory": "2GiB"}, ValueError, "reserve.shared_memory"),
        ({"blocks": 1.5}, TypeError, "reserve.blocks"),
    ],
)
def test_reserve_rejects_bad_values(kwargs, error, match):
    with pytest.raises(error, match=match):
        fr.Reserve(**kwargs)


def test_reserve_sizes():
    assert fr.Reserve(shared_memory=0).as_tuple() == (1, 512, 64, 0)
    assert fr.Reserve(blocks=2, threads=256, shared_memory="16KiB").as_tuple() == (
        2,
        256,
        64,
        16384,
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"reserve": (1, 512, 64, 0)}, TypeError, "reserve must be a freeride.Reserve"),
        ({"time_slice": "2ms"}, TypeError, "time_slice"),
        ({"time_slice": 0}, ValueError, "time_slice"),
        ({"time_slice": float("nan")}, ValueError, "time_slice"),
        ({"time_slice": 120}, ValueError, "time_slice"),
        ({"time_slice": True}, TypeError, "time_slice"),
    ],
)
def test_harvester_rejects_bad_reserve_and_slice(kwargs, error, match):
    with pytest.raises(error, match=match):
        fr.Harvester("cpu", **kwargs)


def test_harvester_reports_its_reserve_and_slice():
    with fr.Harvester("cpu", reserve=None, time_slice=None) as h:
        assert h.reserve.blocks == 0
        assert h.time_slice is None
    with fr.Harvester("cpu", reserve=fr.Reserve(threads=256), time_slice=0.01) as h:
        assert h.reserve.threads == 256
        assert h.time_slice == 0.01
    with fr.Harvester("cpu") as h:
        assert h.reserve == fr.Reserve()
        assert h.time_slice == 0.002


def test_backend_info_names_the_reserve_mechanism():
    info = fr.backend_info()
    if not info["devices"]:
        assert info["reserve_mechanism"] == "occupancy-cap"
        assert info["reserve_fallback"] is None
    for dev in info["devices"]:
        # What the last harvester on the device used; a GPU test may have made one.
        assert dev["reserve_mechanism"] == "occupancy-cap" or dev["reserve_mechanism"].startswith(
            "green-context ("
        )
        assert isinstance(dev["green_contexts"], bool)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"mechanism": "x"}, ValueError, "reserve.mechanism"),
        ({"mechanism": "green"}, ValueError, "reserve.mechanism"),
        (
            {"mechanism": "occupancy-cap", "sms": 8},
            ValueError,
            "reserve.sms",
        ),  # no SMs to leave out
        ({"mechanism": "green-context", "sms": 0}, ValueError, "reserve.sms"),
        ({"mechanism": "green-context", "sms": 2000}, ValueError, "reserve.sms"),
        ({"mechanism": "green-context", "sms": 1.5}, TypeError, "reserve.sms"),
        ({"mechanism": "green-context", "sms": True}, TypeError, "reserve.sms"),
    ],
)
def test_reserve_rejects_bad_mechanisms_and_sms(kwargs, error, match):
    with pytest.raises(error, match=match):
        fr.Reserve(**kwargs)


def test_green_context_reserve_keeps_its_per_sm_shape():
    # The block shape still applies to RawKernel tasks and to the fallback.
    r = fr.Reserve(mechanism="green-context", sms=16)
    assert (r.mechanism, r.sms) == ("green-context", 16)
    assert r.as_tuple() == DEFAULT
    # Whole SMs by default (where the driver has green contexts; else the cap).
    assert fr.Reserve().mechanism == "green-context" and fr.Reserve().sms is None
    assert fr.Reserve() == GREEN
    # reserve=None is no reserve at all, not a green context.
    assert NO_RESERVE.mechanism == "occupancy-cap" and NO_RESERVE.blocks == 0


@pytest.mark.parametrize(
    ("total", "reserved", "min_partition", "alignment", "sms"),
    [
        (132, 8, 8, 8, 120),  # H100: 124 rounded down to the 8-SM step leaves 12 out
        (132, 12, 8, 8, 120),
        (132, 13, 8, 8, 112),
        (132, 124, 8, 8, 8),
        (132, 125, 8, 8, 0),  # 7 SMs left: below the smallest partition
        (108, 8, 4, 2, 100),  # A100
        (10, 3, 0, 0, 7),  # no rules reported: any count
        (8, 8, 8, 8, 0),
    ],
)
def test_green_context_split_arithmetic(total, reserved, min_partition, alignment, sms):
    assert _C.green_context_sms(total, reserved, min_partition, alignment) == sms


def test_default_green_context_reserve_is_eight_sms_in_the_driver_step():
    assert _C.default_reserved_sms(8) == 8
    assert _C.default_reserved_sms(2) == 8
    assert _C.default_reserved_sms(6) == 12
    assert _C.default_reserved_sms(0) == 8


@pytest.mark.parametrize(
    ("total", "sms", "min_partition", "alignment", "cc", "plan"),
    [
        # H100: the default 8 SMs left out, 124 rounded down to the 8-SM step: ask for 120.
        (132, 0, 8, 8, 90, ("ask", 120, 8, "")),
        (132, 12, 8, 8, 90, ("ask", 120, 12, "")),
        (132, 13, 8, 8, 90, ("ask", 112, 13, "")),
        (132, 124, 8, 8, 90, ("ask", 8, 124, "")),
        # A driver before CUDA 13 reports no rules: Hopper's guideline (8, 8) applies...
        (132, 0, 0, 0, 90, ("ask", 120, 8, "")),
        # ...and Ampere's (4 SMs, step 2).
        (108, 0, 0, 0, 80, ("ask", 100, 8, "")),
        # A100-like rules reported by the driver: partitions of 2, step 2.
        (108, 0, 2, 2, 80, ("ask", 100, 8, "")),
        (108, 7, 2, 2, 80, ("ask", 100, 7, "")),
        (108, 106, 2, 2, 80, ("ask", 2, 106, "")),
        # A default reserve no partition can honour falls back instead of failing.
        (
            12,
            0,
            8,
            8,
            90,
            ("fallback", 0, 8, "no green context of at least 8 SMs leaves 8 of the 12 SMs free"),
        ),
    ],
)
def test_green_context_plan(total, sms, min_partition, alignment, cc, plan):
    assert _C.plan_green_context(total, sms, min_partition, alignment, cc) == plan


@pytest.mark.parametrize(
    ("total", "sms", "min_partition", "alignment", "smallest"),
    [(132, 125, 8, 8, 8), (132, 132, 8, 8, 8), (108, 107, 2, 2, 2), (108, 105, 0, 0, 4)],
)
def test_green_context_plan_refuses_an_explicit_reserve_it_cannot_honour(
    total, sms, min_partition, alignment, smallest
):
    with pytest.raises(
        ValueError, match=rf"reserve\.sms={sms} .*smallest green context \({smallest} SMs\)"
    ):
        _C.plan_green_context(total, sms, min_partition, alignment, 80, device=3)
    with pytest.raises(ValueError, match=rf"on device 3 \({total} SMs\)"):
        _C.plan_green_context(total, sms, min_partition, alignment, 80, device=3)


@pytest.mark.parametrize(
    ("total", "sms", "rules", "groups", "got", "step"),
    [
        (132, 0, (8, 8), 1, 120, ("use", 120, 8, "")),
        (132, 12, (8, 8), 1, 120, ("use", 120, 12, "")),
        (108, 0, (2, 2), 1, 100, ("use", 100, 8, "")),
        # The driver rounded the partition up past the SMs that must stay free.
        (
            132,
            0,
            (8, 8),
            1,
            128,
            (
                "fallback",
                128,
                8,
                "the driver split 128 of 132 SMs off for side work, which leaves fewer than 8 free",
            ),
        ),
        (
            108,
            7,
            (2, 2),
            1,
            102,
            (
                "fallback",
                102,
                7,
                "the driver split 102 of 108 SMs off for side work, which leaves fewer than 7 free",
            ),
        ),
        # No group, or an empty one.
        (
            132,
            0,
            (8, 8),
            0,
            120,
            (
                "fallback",
                120,
                8,
                "the driver split 120 of 132 SMs off for side work, which leaves fewer than 8 free",
            ),
        ),
        (
            132,
            0,
            (8, 8),
            1,
            0,
            (
                "fallback",
                0,
                8,
                "the driver split 0 of 132 SMs off for side work, which leaves fewer than 8 free",
            ),
        ),
    ],
)
def test_green_context_split_check(total, sms, rules, groups, got, step):
    assert _C.check_green_split(total, sms, *rules, 90, groups, got) == step


def test_host_harvester_ignores_the_reserve_mechanism():
    with fr.Harvester("cpu", reserve=fr.Reserve(mechanism="green-context")) as h:
        assert h.reserve.mechanism == "green-context"
        assert h.reserve_mechanism == "none"
        assert h.reserve_fallback is None


def _census(*ranges):
    """A census bitmap (SmCensus::seen) with a bit for every SM id in `ranges`."""
    words = [0] * 128
    for ids in ranges:
        for sm in ids:
            words[sm // 32] |= 1 << (sm % 32)
    return words


ESCAPED = (
    "the green context's blocks ran on {} SMs, more than its 120 (of 132): the driver does "
    "not confine runtime launches to the partition"
)

PAST_BITMAP = (
    "the green context's blocks ran on SM ids past 4095 (3 of 40 blocks): the SMs they ran "
    "on cannot be counted"
)
UNFINISHED = (
    "the check that the green context's blocks stay on its 120 SMs did not finish within 5 s"
)


@pytest.mark.parametrize(
    ("seen", "kwargs", "step"),
    [
        # Every SM of the partition, or fewer (others busy): the green context stays.
        (_census(range(120)), {}, ("use", 120, 12, "")),
        (_census(range(12, 132)), {}, ("use", 120, 12, "")),
        (_census(range(40)), {}, ("use", 40, 12, "")),
        # SM ids need not be contiguous: what counts is how many.
        (_census(range(0, 240, 2)), {}, ("use", 120, 12, "")),
        # One SM past the partition, or the whole device: launches escape it.
        (_census(range(121)), {}, ("fallback", 121, 12, ESCAPED.format(121))),
        (_census(range(0, 242, 2)), {}, ("fallback", 121, 12, ESCAPED.format(121))),
        (_census(range(132)), {}, ("fallback", 132, 12, ESCAPED.format(132))),
        # Blocks on ids past the bitmap cannot be told apart.
        (
            _census(range(8)),
            {"beyond": 3, "blocks": 40},
            (
                "fallback",
                8,
                12,
                PAST_BITMAP,
            ),
        ),
        # Nothing ran, or nothing was seen to end: nothing is known.
        (
            _census(),
            {"blocks": 0},
            (
                "fallback",
                0,
                12,
                "the check that the green context's blocks stay on its SMs ran no block",
            ),
        ),
        (
            _census(range(120)),
            {"finished": False, "deadline_s": 5},
            (
                "fallback",
                0,
                12,
                UNFINISHED,
            ),
        ),
    ],
)
def test_green_context_partition_check(seen, kwargs, step):
    """G18: the green context stays only where its blocks ran on no more SMs than it holds
    (green_context_plan.hpp, check_green_partition)."""
    assert _C.check_green_partition(120, 132, seen, **kwargs) == step


def test_the_host_backend_has_no_green_workqueues():
    """FREERIDE_GREEN_WORKQUEUE (read as a CUDA harvester is made: test_launch_at_open's
    switch test) concerns the green context only: the host backend has none."""
    with fr.Harvester("cpu", workers=1) as h:
        assert h.green_workqueues is None
