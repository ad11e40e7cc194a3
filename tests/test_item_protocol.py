"""What the item protocol costs per item, checked without a GPU: NVRTC (tests/nvrtc.py)
compiles kernels that use freeride::for_each_item against this checkout's
csrc/include, and the PTX says what the loop adds to each item. No system-scope fence
per item (one per launch, before the end record), one block barrier per item, the gate
and stop loads issued together. How long an item takes
needs a GPU: `freeride bench items` measures that."""

import functools
import os
import re

import pytest
from nvrtc import SCALE, compile_ptx, find_nvrtc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The header in this checkout, not fr.include_dir(): that may be an installed copy.
INCLUDE = os.path.join(ROOT, "csrc", "include")

pytestmark = pytest.mark.skipif(
    find_nvrtc() is None, reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)"
)

# compute_90: PTX only, the way CuPy compiles a RawKernel. sm_80 and sm_90 (CMake's
# targets for the built-in kernels): NVRTC also runs ptxas, so the header's inline PTX
# is assembled for both.
ARCHS = ["compute_90", "sm_80", "sm_90"]

# A body with its own shared memory and __syncthreads (as PageRank's contributions).
REDUCE = r"""
#include <freeride/preempt.cuh>
extern "C" __global__ void __launch_bounds__(256) reduce(fr_item_ctx ctx, const float* x,
                                                         float* out) {
  __shared__ float part[256];
  freeride::for_each_item(ctx, [&](unsigned long long item) {
    part[threadIdx.x] = x[item * 256 + threadIdx.x];
    __syncthreads();
    if (threadIdx.x == 0) {
      float total = 0.f;
      for (int i = 0; i < 256; ++i) total += part[i];
      out[item] = total;
    }
  });
}
"""

# The pieces for_each_item is made of, used directly (as Spin's sliced kernel does), and
# a body that only the leader runs (as ItemCounter's).
PIECES = r"""
#include <freeride/preempt.cuh>
extern "C" __global__ void one_item(fr_item_ctx ctx, unsigned int* hits) {
  __shared__ unsigned long long s_item;
  if (freeride::leader_thread()) s_item = freeride::claim_item(ctx, freeride::enter_launch(ctx));
  __syncthreads();
  if (s_item != freeride::kNoItem) {
    atomicAdd(&hits[s_item], 1u);
    __syncthreads();
    if (freeride::leader_thread()) freeride::finish_item(ctx);
  }
  freeride::leave_launch(ctx);
}
extern "C" __global__ void leader_only(fr_item_ctx ctx, unsigned int* hits) {
  static_assert(freeride::kProgressEvery == 8, "tests poll items_done in steps of 8");
  freeride::for_each_item(ctx, [&](unsigned long long item) {
    if (!freeride::leader_thread()) return;
    atomicAdd(&hits[item], 1u);
  });
}
"""


# Device phases (csrc/device_phases.hpp): one launch serves every phase of the task, the
# body taking the phase with the item (as a ping-pong stencil picks its buffers).
PHASES = r"""
#include <freeride/preempt.cuh>
extern "C" __global__ void sweep(fr_item_ctx ctx, float* a, float* b, unsigned long long n) {
  freeride::for_each_phase_item(ctx, [&](unsigned long long phase, unsigned long long item) {
    const float* src = phase % 2 ? b : a;
    float* dst = phase % 2 ? a : b;
    unsigned long long i = item * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i] * 0.5f;
  });
}
"""


SOURCES = {
    "scale": SCALE,
    "reduce": REDUCE,
    "one_item": PIECES,
    "leader_only": PIECES,
    "sweep": PHASES,
}

_BARRIER = re.compile(r"(?:bar|barrier)(?:\.cta)?\.(?:sync|arrive|red)\b")
_SYSTEM_FENCE = re.compile(r"(?:membar\.sys|fence(?:\.\w+)*\.sys)\b")
_ANY_FENCE = re.compile(r"(?:membar|fence)\.")
_SYSTEM_ATOMIC = re.compile(r"(?:atom|red)(?:\.\w+)*\.sys\b")
_VOLATILE_U32_LOAD = re.compile(r"ld\.volatile\.global\.u32\s+(%r\d+)")
_VOLATILE_V4_LOAD = re.compile(r"ld\.volatile\.global\.v4\.u32\s")


@functools.cache
def _ptx(source: str, arch: str) -> str:
    return compile_ptx(source, [f"-I{INCLUDE}", f"-arch={arch}"])


def instructions(ptx: str, kernel: str) -> list[str]:
    """The instructions of .entry `kernel`, one a line, without labels, directives,
    braces or comments; a guard predicate (@%p1, @!%p1) is dropped."""
    m = re.search(r"\.entry\s+" + re.escape(kernel) + r"\s*\(", ptx)
    assert m is not None, f"no .entry {kernel} in the PTX"
    end = ptx.find(".entry", m.end())
    body = ptx[m.end() : end if end != -1 else len(ptx)]
    body = body[body.index(")") :]  # past the parameter list
    out = []
    for line in body.splitlines():
        line = line.split("//", 1)[0].strip()
        if not line or line[0] in ".{})" or line.endswith(":"):
            continue
        out.append(re.sub(r"^@!?%\w+\s+", "", line))
    return out


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel", sorted(SOURCES))
def test_header_compiles(kernel, arch):
    assert instructions(_ptx(SOURCES[kernel], arch), kernel)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel", sorted(SOURCES))
def test_one_system_scope_fence_per_launch_and_no_system_atomic(kernel, arch):
    """Items need no fence: the host learns `done` and that the results are complete from
    the launch's end record, which the last block out writes behind one system-scope
    fence (preempt.cuh, leave_launch). One in the whole kernel, so none per item; a fence
    added to the claim or the count would be inlined into the loop and show here."""
    code = instructions(_ptx(SOURCES[kernel], arch), kernel)
    assert sum(1 for i in code if _SYSTEM_FENCE.match(i)) == 1, "system-scope fences"
    assert not [i for i in code if _SYSTEM_ATOMIC.match(i)], "a system-scope atomic"
    if kernel == "scale":
        # Nothing in its body asks for a fence: the only ones are leave_launch's, once
        # per block (its writes, then the end record's read) and the end record's.
        assert sum(1 for i in code if _ANY_FENCE.match(i)) == 3


@pytest.mark.parametrize("arch", ARCHS)
def test_one_block_barrier_per_item(arch):
    """The kernel is compiled with both of for_each_item's paths: the plain grid-stride
    loop (a context without phase state: one barrier after each item) and the protocol
    loop, whose one barrier per item both ends an item and hands out the next claim, plus
    one as the block leaves the launch (leave_launch). A body without barriers therefore
    shows three in all; one with a barrier of its own (inlined into both paths) five."""
    scale = instructions(_ptx(SCALE, arch), "scale")
    assert sum(1 for i in scale if _BARRIER.match(i)) == 3
    reduce = instructions(_ptx(REDUCE, arch), "reduce")
    assert sum(1 for i in reduce if _BARRIER.match(i)) == 5


def _load_runs(code: list[str]) -> list[tuple[int, tuple[str, ...]]]:
    """Runs of adjacent volatile global loads: (index of the first, their widths: "u32",
    "v4", "u64")."""
    runs, n = [], 0
    while n < len(code):
        if not code[n].startswith("ld.volatile.global"):
            n += 1
            continue
        first, widths = n, []
        while n < len(code) and code[n].startswith("ld.volatile.global"):
            widths.append("v4" if _VOLATILE_V4_LOAD.match(code[n]) else code[n].split()[0][-3:])
            n += 1
        runs.append((first, tuple(widths)))
    return runs


CLAIM = ("u32", "u32", "u32", "v4")  # the gate, the stop flag, the launch's look, the slots


@pytest.mark.parametrize("arch", ARCHS)
def test_a_claims_loads_are_issued_together(arch):
    """The leader's loads at a claim (the gate, the stop flag, the launch's first look at
    the close slots and the slots: may_run_in_bubble) are adjacent instructions, so none
    waits for another's round trip: nothing compares one before the last is issued. (One
    asm block, so the compiler cannot put anything between them; ptxas keeps volatile
    loads in order.) The compiler peels the loop's first claim, so the run shows twice;
    beside each, may_run's pair for a context without close slots. The last of the
    body's volatile u32 loads is leave_launch's read of `held`, once per launch."""
    code = instructions(_ptx(SCALE, arch), "scale")
    runs = _load_runs(code)
    claims = [first for first, widths in runs if widths == CLAIM]
    assert len(claims) == 2, runs
    assert sum(1 for _, widths in runs if widths == ("u32", "u32")) == 2, runs
    for first in claims:
        loaded = set()
        for i in code[first : first + len(CLAIM)]:
            loaded.update(re.findall(r"%r\d+", i.split("[")[0]))
        either = re.compile(r"(?:" + "|".join(re.escape(r) for r in loaded) + r")\b")
        uses = [n for n, i in enumerate(code) if n >= first + len(CLAIM) and either.search(i)]
        assert uses, code[first : first + len(CLAIM)]


@pytest.mark.parametrize("arch", ARCHS)
def test_each_block_looks_at_the_close_slots_once_as_it_begins(arch):
    """A launch never runs in two bubbles (freeride/slice.h, closed_since): each block
    reads the close slots once as it begins (one 16-byte load), and the launch keeps the
    earliest look with one atomic max, before the block's first claim; nothing else
    in the kernel takes a maximum."""
    code = instructions(_ptx(SCALE, arch), "scale")
    maxes = [n for n, i in enumerate(code) if i.startswith("atom.global.max.u32")]
    assert len(maxes) == 1, maxes
    runs = _load_runs(code)
    lone = [first for first, widths in runs if widths == ("v4",)]
    assert len(lone) == 1 and lone[0] < maxes[0], runs
    first_claim = min(first for first, widths in runs if widths == CLAIM)
    assert maxes[0] < first_claim


@pytest.mark.parametrize("arch", ARCHS)
def test_a_block_leaves_through_a_barrier_then_one_fence_by_its_leader(arch):
    """Review F13: each thread fenced its own writes before the block's barrier and the
    leader counted the block out after it; in the PTX memory model the leader's release
    then covered only its own writes. Now the barrier comes first and the leader fences
    after it (fences are cumulative: that covers every write the barrier ordered before
    it), then counts the block out: a device-scope fence between the last barrier and the
    launch's `exited` count, and none just before that barrier."""
    code = instructions(_ptx(SCALE, arch), "scale")
    exited = [n for n, i in enumerate(code) if i.startswith("atom.global.add.u32")][-1]
    barrier = max(n for n in range(exited) if _BARRIER.match(code[n]))
    between = code[barrier + 1 : exited]
    assert any(_ANY_FENCE.match(i) and not _SYSTEM_FENCE.match(i) for i in between), between
    before = code[max(0, barrier - 3) : barrier]
    assert not any(_ANY_FENCE.match(i) for i in before), before


@pytest.mark.parametrize("arch", ARCHS)
def test_close_pending_reads_both_words_in_one_round_trip(arch):
    """Past its slice the block that refreshes its launch's answer asks whether the close
    ending its bubble is pending (freeride/slice.h): the latest close's ordinal (host
    memory, across the bus) and the executed slots (one 16-byte load) are issued together,
    so the question costs one round trip, and there is one such pair in the claim path
    (no second copy)."""
    code = instructions(_ptx(SCALE, arch), "scale")
    pairs = [first for first, widths in _load_runs(code) if widths == ("u32", "v4")]
    assert len(pairs) == 1, _load_runs(code)


@pytest.mark.parametrize("arch", ARCHS)
def test_only_the_block_that_takes_the_refresh_reads_across_the_bus(arch):
    """Past its slice a block looks at its launch's shared answer (one volatile 64-bit
    load of fr_launch_run.pending); only when that is stale does it try to take the
    refresh (a compare-and-swap on the same word), and only the winner issues the read of
    the latest close's ordinal (host memory) with the slots, then publishes the answer
    (a second compare-and-swap, over the word it put in) and reads the gate again. One
    read per claim of every block flooded the bus on an H200 (freeride/slice.h)."""
    code = instructions(_ptx(SCALE, arch), "scale")
    cas = [n for n, i in enumerate(code) if i.startswith("atom.global.cas.b64")]
    # The read across the bus: the latest close's ordinal with the slots.
    vector = [first + 1 for first, widths in _load_runs(code) if widths == ("u32", "v4")]
    assert len(vector) == 1, vector
    # The look at the shared answer; a block that finds it stale while another refreshes
    # waits for that refresh to land (freeride/slice.h, waits_for_refresh), looking at
    # the word again after each nap: at its look, and as the loser of the race to take
    # the refresh (after the compare-and-swap). leave_launch's reads of the end record's
    # counts come after the claim path.
    looks = [n for n, i in enumerate(code) if i.startswith("ld.volatile.global.u64")]
    naps = [n for n, i in enumerate(code) if i.startswith("nanosleep")]
    assert len(naps) == 2, naps
    for nap in naps:
        assert nap + 1 in looks, (nap, looks)  # a nap, then the word again
    look = [min(looks)]
    assert look[0] < naps[0] < vector[0] < naps[1], (looks, naps, vector)
    # enter_launch's compare-and-swap of the launch's start comes first; then the
    # refresh's two: taking it, and publishing the answer.
    take = [n for n in cas if look[0] < n < vector[0]]
    publish = [n for n in cas if n > vector[0]]
    assert len(take) == 1 and len(publish) == 1, cas
    assert look[0] < take[0] < vector[0] - 1 < vector[0] < publish[0]
    assert not [i for i in code if i.startswith("atom.global.exch")]
    regather = [n for n, i in enumerate(code) if _VOLATILE_U32_LOAD.match(i) and n > publish[0]]
    assert regather, "the gate is not read again after the read across the bus"


@pytest.mark.parametrize("arch", ARCHS)
def test_a_chained_launch_reads_the_phase_before_once_per_block_before_any_claim(arch):
    """Phases ahead (csrc/phase_ahead_rule.hpp): a launch chained at an open behind the
    previous phase's claims nothing unless that phase is complete (fr_item_ctx.after_done).
    The leader reads the count once, as its block begins (phase_ready), from L2
    (ld.global.cg: a previous kernel wrote it, and nothing writes it during this launch),
    after the launch's start and before the first gate read and claim; a block that may
    not claim goes out through the claim path's one `held` count, so the kernel gains no
    atomic of its own."""
    code = instructions(_ptx(SCALE, arch), "scale")
    reads = [n for n, i in enumerate(code) if i.startswith("ld.global.cg.u64")]
    assert len(reads) == 1, reads
    start = next(n for n, i in enumerate(code) if i.startswith("atom.global.cas.b64"))
    gate = next(n for n, i in enumerate(code) if _VOLATILE_U32_LOAD.match(i))
    assert start < reads[0] < gate
    assert sum(1 for i in code if i.startswith("atom.global.add.u32")) == 2, "held and exited"


def _gpu_fences(code: list[str]) -> list[int]:
    return [n for n, i in enumerate(code) if _ANY_FENCE.match(i) and not _SYSTEM_FENCE.match(i)]


@pytest.mark.parametrize("arch", ARCHS)
def test_device_phases_add_one_fence_at_the_wait(arch):
    """for_each_phase_item adds one fence to for_each_item's code, the acquire that ends a
    wait at a phase boundary (below); its counts are releases. Still one system-scope
    fence, no system atomic."""
    sweep = instructions(_ptx(PHASES, arch), "sweep")
    scale = instructions(_ptx(SCALE, arch), "scale")
    assert len(_gpu_fences(sweep)) == len(_gpu_fences(scale)) + 1 == 3
    assert sum(1 for i in sweep if _SYSTEM_FENCE.match(i)) == 1
    assert not [i for i in sweep if _SYSTEM_ATOMIC.match(i)]


@pytest.mark.parametrize("arch", ARCHS)
def test_device_phases_count_with_a_release_after_the_barrier(arch):
    """With device phases the leader counts each item with a release at device scope
    (another block's wait for the phase reads it), after the barrier that ended the item
    (a release covers the writes that barrier ordered before it): the loop's count and
    the last one, each with the plain count beside it for launches of one phase."""
    code = instructions(_ptx(PHASES, arch), "sweep")
    barrier = next(n for n, i in enumerate(code) if _BARRIER.match(i))
    releases = [n for n, i in enumerate(code) if i.startswith("atom.release.gpu.global.add.u64")]
    assert len(releases) == 2 and min(releases) > barrier, (releases, barrier)
    plain = [n for n, i in enumerate(code) if i.startswith("atom.global.add.u64") and n > barrier]
    assert len(plain) == 2, plain


@pytest.mark.parametrize("arch", ARCHS)
def test_device_phases_wait_reads_then_acquires_once_then_meets_at_a_barrier(arch):
    """At a phase boundary the leader reads `done` (strong, relaxed, device scope; pausing
    between reads) until it covers the phases before, then fences with acq_rel once (a
    strong read then a fence: an acquire pattern, one L1 invalidation a wait rather than
    one a read), and the block meets at a barrier before the body: a second barrier per
    item only at such a step."""
    code = instructions(_ptx(PHASES, arch), "sweep")
    loads = [n for n, i in enumerate(code) if i.startswith("ld.relaxed.gpu.global.u64")]
    assert loads, "no strong read of done"
    assert not [i for i in code if i.startswith("ld.acquire")], "an acquire at every read"
    # The other nap is the shared answer's wait for a refresh (close_pending), before.
    sleeps = [n for n, i in enumerate(code) if i.startswith("nanosleep") and n > min(loads)]
    assert len(sleeps) == 1 and sleeps[0] < max(loads), (loads, sleeps)
    fences = [n for n, i in enumerate(code) if i.startswith("fence.acq_rel.gpu")]
    assert len(fences) == 1 and max(loads) < fences[0] <= max(loads) + 4, (loads, fences)
    after = code[fences[0] + 1 : fences[0] + 4]
    assert any(_BARRIER.match(i) for i in after), after


# An 8-byte field of fr_item_ctx read from the kernel's parameters.
_PHASE_ITEMS = re.compile(r"ld\.param\.u64\s+%rd\d+, \[\w+_param_0\+(\d+)\]")
# fr_item_ctx.phase_items: 13 pointers and counts of 8 bytes before it.
PHASE_ITEMS_OFFSET = 13 * 8


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel", ["scale", "one_item"])
def test_a_kernel_without_the_phase_refuses_a_launch_with_device_phases(kernel, arch):
    """for_each_item and the claim_item a kernel calls itself read ctx.phase_items before
    the first claim: a launch with device phases gets no claim from them (the host then
    fails the task, naming for_each_phase_item), where their bodies would take later
    phases' items for ctx.phase's."""
    code = instructions(_ptx(SOURCES[kernel], arch), kernel)
    reads = [
        n
        for n, i in enumerate(code)
        if (m := _PHASE_ITEMS.match(i)) and int(m.group(1)) == PHASE_ITEMS_OFFSET
    ]
    claim = next(n for n, i in enumerate(code) if i.startswith("atom.global.add.u64"))
    assert reads and min(reads) < claim, (reads, claim)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel", ["scale", "one_item"])
def test_a_claim_knows_the_close_of_its_launchs_bubble(kernel, arch):
    """A launch made at an open ends once its bubble's close has executed, however late
    it began (freeride/slice.h, bubble_over): the kernel reads fr_item_ctx.next_close,
    the last field but max_slices, from its parameters before its first claim (alone, or
    with max_slices beside it in one load)."""
    from freeride._C import ITEM_CTX_BYTES

    code = instructions(_ptx(SOURCES[kernel], arch), kernel)
    reads = [n for n, i in enumerate(code) if ITEM_CTX_BYTES - 8 in _u32_param_offsets(i)]
    claim = next(n for n, i in enumerate(code) if i.startswith("atom.global.add.u64"))
    assert reads and min(reads) < claim, (reads, claim)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel", ["scale", "one_item"])
def test_a_claim_past_the_slice_reads_the_launchs_max_slices(kernel, arch):
    """Running on past the slice is bounded by the launch's own fr_item_ctx.max_slices (the
    last field, Harvester(max_slices=...)), not by a constant compiled into the kernel."""
    from freeride._C import ITEM_CTX_BYTES

    code = instructions(_ptx(SOURCES[kernel], arch), kernel)
    assert any(ITEM_CTX_BYTES - 4 in _u32_param_offsets(i) for i in code)


# A load of 32-bit words of fr_item_ctx from the kernel's parameters: one, or two at once.
_U32_PARAM = re.compile(
    r"ld\.param\.(?P<v2>v2\.)?u32\s+(?:%r\d+|\{%r\d+, %r\d+\}), \[\w+_param_0\+(?P<at>\d+)\]"
)


def _u32_param_offsets(instruction: str) -> tuple[int, ...]:
    """The offsets into fr_item_ctx of the 32-bit words `instruction` loads (none if it
    loads no such words)."""
    m = _U32_PARAM.match(instruction)
    if m is None:
        return ()
    at = int(m.group("at"))
    return (at, at + 4) if m.group("v2") else (at,)
