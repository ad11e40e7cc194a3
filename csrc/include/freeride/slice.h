/* How long a launch may go on claiming items: the rule the kernels apply at every claim
 * (freeride/preempt.cuh) and the host's tests check on the CPU. Host and device code:
 * no standard library, so that NVRTC compiles it for user kernels.
 *
 * A launch claims items for one time slice from its first block's start. Past it, a
 * block claims on only while the close that ends the current bubble is already in the
 * GPU's queues (a close is pending): then a device-wide synchronisation the host issues
 * (torch.cuda.synchronize, cudaFree inside an allocation, empty_cache) waits for
 * training's queued work up to that close anyway, with or without side work, and the
 * slice has nothing left to bound. While no close is pending the host may block on such a
 * synchronisation before it enqueues the next close, and a launch that ran on would never
 * end: the slice is what bounds that wait.
 *
 * Pending is decided afresh at every claim past the slice, from two things and no state
 * carried across bubbles: the ordinal of the latest stream-ordered close the host has
 * enqueued (the host publishes it once the close is in its stream, in mapped host memory),
 * and the ordinals closes have written as they executed (each close's own batch writes its
 * ordinal k to slot k % FREERIDE_CLOSE_SLOTS, in device memory). The latest close is
 * pending exactly while its slot does not hold its ordinal. A close the host enqueued
 * that already took effect unseen (a compute action shorter than the item in flight), a
 * close on another stream, an immediate close (never counted: it has taken effect when
 * it returns) or a close captured into a graph (never counted: a replay would write a
 * stale ordinal) cannot make a launch run on into a bubble whose close the host has not
 * enqueued. Slots rather than one word: with closes on several streams an older close can
 * execute after the latest, and would overwrite a single word with an ordinal that reads
 * as pending.
 *
 * Even with a close pending the extension is bounded, to fr_item_ctx.max_slices slices
 * (FREERIDE_MAX_SLICES by default) from the launch's start: a training kernel larger
 * than the reserve, launched in a bubble on another stream (a bucket copy, a reduction,
 * an optimizer on its own stream), gets the SMs the side launch holds when it ends, so
 * the bound is how long such a kernel can be confined to the reserve.
 *
 * The latest ordinal lives in host memory, so each look at it is a read across the bus.
 * A launch has up to thousands of blocks claiming an item every few microseconds: one
 * read per claim floods the bus (on an H200 a launch past its slice then ran a quarter of
 * its items, and a close took effect milliseconds late, because a claim combined the gate
 * as read before such a read with its answer). So a launch shares one answer among its
 * blocks, in its own device memory (fr_launch_run.pending): an answer younger than
 * FREERIDE_PENDING_FRESH_NS is used as it is; an older one is refreshed by the one block
 * whose compare-and-swap takes it, which marks the refresh in flight (no second read
 * starts meanwhile) and reads the gate again after its read; the others go on with the
 * old answer only while it is younger than two windows, and after that wait for the
 * refresh to land (waits_for_refresh) and read the gate again. No claim is therefore
 * decided on an answer read more than two windows plus one read earlier, whatever the
 * items' length: a launch claims its last item at most that long after nothing is
 * pending, which bounds a device-wide synchronisation's wait as the slice does (plus the
 * item, as with the slice; two items where a block crosses a phase boundary of device
 * phases, whose wait for the phase before looks at nothing else). A launch's first look
 * has no answer yet: it counts as pending, stamped then, until the first read lands,
 * within the same bound. */
#ifndef FREERIDE_SLICE_H_
#define FREERIDE_SLICE_H_

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define FREERIDE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FREERIDE_HOST_DEVICE inline
#endif

/* Slots closes write their ordinals to (a power of two: the index is a mask), read with
 * one 16-byte load. */
#define FREERIDE_CLOSE_SLOTS 4u
/* The longest a launch claims items while a close is pending, in time slices, by default
 * (Harvester(max_slices=...) sets it per harvester: fr_item_ctx.max_slices). */
#define FREERIDE_MAX_SLICES 8ull

namespace freeride {

/* How old a launch's shared answer to "is a close pending" may be and still be used. */
#define FREERIDE_PENDING_FRESH_NS 10000ull
/* The longest a block waits for another block's refresh to land (waits_for_refresh): a
 * guard, a read across the bus takes microseconds; after it the block stops, as it would
 * on no answer. */
#define FREERIDE_PENDING_WAIT_NS (4ull * FREERIDE_PENDING_FRESH_NS)
/* fr_launch_run.pending: the top bit is the answer, the next says a block is refreshing
 * it, the others are the %globaltimer at which the read it came from landed; 0 is no
 * answer yet. */
#define FREERIDE_PENDING_BIT (1ull << 63)
#define FREERIDE_PENDING_IN_FLIGHT (1ull << 62)
#define FREERIDE_PENDING_STAMP (FREERIDE_PENDING_IN_FLIGHT - 1ull)

/* Where a launch that has run `ran_ns` stands in its time, with a slice of `slice_ns` and
 * running on bounded to `max_slices` slices (0: FREERIDE_MAX_SLICES). */
enum SliceTime {
  kWithinSlice = 0, /* claims freely (also: no slice at all, slice_ns == 0) */
  kExtendable = 1,  /* past the slice: claims only while a close is pending */
  kSliceOver = 2    /* past the bound on extension: claims no more */
};

FREERIDE_HOST_DEVICE SliceTime slice_time(unsigned long long ran_ns,
                                          unsigned long long slice_ns,
                                          unsigned long long max_slices = 0ull) {
  if (slice_ns == 0ull || ran_ns < slice_ns) return kWithinSlice;
  const unsigned long long most = max_slices == 0ull ? FREERIDE_MAX_SLICES : max_slices;
  /* ran < slice * most without the product's overflow: floor(ran / most) < slice. */
  return ran_ns / most < slice_ns ? kExtendable : kSliceOver;
}

#if FREERIDE_CLOSE_SLOTS != 4u
#error "close_pending selects among exactly four slots"
#endif

/* Whether the latest close the host has enqueued (`latest`, 0: none yet) has not executed:
 * `executed` is the slots as read, FREERIDE_CLOSE_SLOTS of them. */
FREERIDE_HOST_DEVICE bool close_pending(unsigned int latest, const unsigned int* executed) {
  /* Selected with constant indices: a slot indexed by a loaded value would put the slots,
   * loaded into registers, through local memory in a kernel. */
  const unsigned int slot = latest & (FREERIDE_CLOSE_SLOTS - 1u);
  unsigned int seen = executed[0];
  seen = slot == 1u ? executed[1] : seen;
  seen = slot == 2u ? executed[2] : seen;
  seen = slot == 3u ? executed[3] : seen;
  return seen != latest;
}

/* A launch never runs in two bubbles: once a stream-ordered close has executed since it
 * began, it claims no more, whether or not a block saw the gate closed. A close and the
 * next open can both take effect while a block is inside an item (a compute action
 * shorter than the item); a launch that ran on through them would serve the next bubble
 * with that bubble's own launch, enqueued at its open, waiting behind it on the stream.
 * A waiting launch holds every kernel behind it on its hardware queue (one, under
 * CUDA_DEVICE_MAX_CONNECTIONS=1), training's included, until the launch ahead of it ends:
 * its slice, or with time_slice=None the next close, which training may enqueue only
 * after those very kernels (the hang tests/test_hardware_queues.py met on an H200).
 *
 * Each block reads the slots as it begins (enter_launch) and keeps the launch's earliest
 * look in fr_launch_run.closes_seen (an atomic max of closes_word, which falls as closes
 * execute); every claim reads the slots again with the gate. The word is the slots'
 * sum, inverted: each executed close raises its slot (from the ordinal four closes back,
 * or zero), so the sum grows by at least one with every close and the word falls, until
 * it wraps after about a billion closes (where one launch may miss one close). 0 stands
 * for "not yet looked", so a launch whose word is 0 goes without the rule. Only closes
 * that carry an ordinal write a slot: an immediate close (the host's) or one captured
 * into a graph ends no launch this way (a graph replay's close cannot be told from a
 * stale one), so a launch whose bubble such a close ends relies on seeing the gate closed
 * and, where the close and the next open both pass inside an item, on its time slice:
 * with time_slice=None it may run into the next bubble. A close on another stream does
 * end it: a bubble's launch then ends early, never late. */
FREERIDE_HOST_DEVICE unsigned int closes_word(const unsigned int* executed) {
  return ~(executed[0] + executed[1] + executed[2] + executed[3]);
}

/* Whether a close has executed since a launch whose earliest look was `seen` began. */
FREERIDE_HOST_DEVICE bool closed_since(unsigned int seen, const unsigned int* executed) {
  return seen != 0u && closes_word(executed) != seen;
}

/* A launch made at an open knows its bubble better than its first look can: a launch
 * queued behind another on its stream begins only once that one has left, possibly after
 * its own bubble's close (a bubble and the compute after it both shorter than an item),
 * and would take that close for history. So the host gives it the ordinal the first close
 * after its open gets (`next_close`, 0: none), and the launch's bubble is over once a
 * slot holds that ordinal or a later one (signed differences: ordinals wrap, skipping 0).
 * The executor's own launches for an open carry the ordinal noted as that open was
 * written (csrc/cuda/open_ordinals.hpp). An older close executing late on a stream four
 * closes behind another can overwrite a slot with a smaller ordinal: a launch that began
 * before both still ends by its first look, one that began after both may miss its
 * bubble's close (gate writes are meant to come from one stream: open_launch_rule.hpp). */
FREERIDE_HOST_DEVICE bool bubble_over(unsigned int next_close, const unsigned int* executed) {
  return next_close != 0u && (static_cast<int>(executed[0] - next_close) >= 0 ||
                              static_cast<int>(executed[1] - next_close) >= 0 ||
                              static_cast<int>(executed[2] - next_close) >= 0 ||
                              static_cast<int>(executed[3] - next_close) >= 0);
}

/* The shared answer's word: `pending` as read at `at_ns`, with `in_flight` while a block
 * refreshes it (never 0: that is no answer). */
FREERIDE_HOST_DEVICE unsigned long long pending_word(bool pending, unsigned long long at_ns,
                                                     bool in_flight = false) {
  unsigned long long stamp = at_ns & FREERIDE_PENDING_STAMP;
  if (stamp == 0ull) stamp = 1ull;
  return stamp | (pending ? FREERIDE_PENDING_BIT : 0ull) |
         (in_flight ? FREERIDE_PENDING_IN_FLIGHT : 0ull);
}

/* How long ago a word's answer was read, at `now_ns`; a stamp ahead of the looking block's
 * clock (another block's look a moment later) counts as just read. */
FREERIDE_HOST_DEVICE unsigned long long pending_age(unsigned long long word,
                                                    unsigned long long now_ns) {
  const unsigned long long stamp = word & FREERIDE_PENDING_STAMP;
  return now_ns > stamp ? now_ns - stamp : 0ull;
}

/* The answer a block may go on with, without refreshing: a pending close read less than
 * two freshness windows ago. No answer yet (0) and an older one both read as not pending:
 * the block stops at its slice, as it would without the rule. */
FREERIDE_HOST_DEVICE bool pending_answer(unsigned long long word, unsigned long long now_ns) {
  return word != 0ull && (word & FREERIDE_PENDING_BIT) != 0ull &&
         pending_age(word, now_ns) < 2ull * FREERIDE_PENDING_FRESH_NS;
}

/* Whether a block that finds `word` at `now_ns` waits for the refresh in flight rather
 * than go on: its answer is too old to use (two windows) and another block is reading
 * afresh. Going on would read "not pending" and the block would leave the launch for
 * good, while the close may well be pending: on an H200 launches in bubbles whose close
 * was enqueued lost blocks this way whenever a read across the bus took longer than a
 * window (harvest 0.39-0.64 of the open gate's rate in 20 ms bubbles). The
 * wait lasts at most the read in flight (FREERIDE_PENDING_WAIT_NS at most), so a claim
 * rests on an answer at most two windows plus one read old. */
FREERIDE_HOST_DEVICE bool waits_for_refresh(unsigned long long word, unsigned long long now_ns) {
  return (word & FREERIDE_PENDING_IN_FLIGHT) != 0ull &&
         pending_age(word, now_ns) >= 2ull * FREERIDE_PENDING_FRESH_NS;
}

/* One block's look at the shared answer at `now_ns`: go on with `answer`, or take the
 * refresh by swapping `word` for `kept` and then read across the bus. Refreshed: no answer
 * yet, or one at least a window old that nobody is refreshing. `kept` marks the refresh in
 * flight and keeps the answer's own stamp, so that the others use it only while it is
 * less than two windows old (a first look's kept word is a provisional "pending", stamped
 * now: the launch's blocks do not all stop at their slice while one of them asks). */
struct PendingLook {
  bool refresh;            /* take the refresh: compare-and-swap `word` for `kept` */
  bool answer;             /* the answer to go on with unless this block refreshes */
  unsigned long long kept; /* with `refresh`: the word to swap in */
};

FREERIDE_HOST_DEVICE PendingLook look_at_pending(unsigned long long word,
                                                 unsigned long long now_ns) {
  PendingLook look;
  look.refresh = word == 0ull || ((word & FREERIDE_PENDING_IN_FLIGHT) == 0ull &&
                                  pending_age(word, now_ns) >= FREERIDE_PENDING_FRESH_NS);
  look.answer = pending_answer(word, now_ns);
  look.kept = !look.refresh          ? word
              : word == 0ull         ? pending_word(true, now_ns, true)
                                     : word | FREERIDE_PENDING_IN_FLIGHT;
  return look;
}

/* The whole decision at one claim, for the host's tests: the gate reads open, the
 * launch's bubble is not over (no close executed since its first look `seen`, nor one of
 * ordinal `next_close` or later; 0: neither known), and the launch is within its slice,
 * or past it with a close pending and within the bound. The kernels make the same
 * decision but look at whether a close is pending only when past the slice, and then
 * through their launch's shared answer (look_at_pending). */
FREERIDE_HOST_DEVICE bool may_claim(bool gate_open, unsigned long long ran_ns,
                                    unsigned long long slice_ns, unsigned int latest,
                                    const unsigned int* executed, unsigned int seen = 0u,
                                    unsigned int next_close = 0u,
                                    unsigned long long max_slices = 0ull) {
  if (!gate_open || closed_since(seen, executed) || bubble_over(next_close, executed)) {
    return false;
  }
  const SliceTime t = slice_time(ran_ns, slice_ns, max_slices);
  return t == kWithinSlice || (t == kExtendable && close_pending(latest, executed));
}

}  /* namespace freeride */

#endif /* FREERIDE_SLICE_H_ */
