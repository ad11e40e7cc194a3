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
 * Even with a close pending the extension is bounded, to FREERIDE_MAX_SLICES slices from
 * the launch's start: a training kernel larger than the reserve, launched in a bubble on
 * another stream (a bucket copy, a reduction, an optimizer on its own stream), gets the
 * SMs the side launch holds when it ends, so the bound is how long such a kernel can be
 * confined to the reserve. */
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
/* The longest a launch claims items while a close is pending, in time slices. */
#define FREERIDE_MAX_SLICES 8ull

namespace freeride {

/* Where a launch that has run `ran_ns` stands in its time. */
enum SliceTime {
  kWithinSlice = 0, /* claims freely (also: no slice at all, slice_ns == 0) */
  kExtendable = 1,  /* past the slice: claims only while a close is pending */
  kSliceOver = 2    /* past the bound on extension: claims no more */
};

FREERIDE_HOST_DEVICE SliceTime slice_time(unsigned long long ran_ns,
                                          unsigned long long slice_ns) {
  if (slice_ns == 0ull || ran_ns < slice_ns) return kWithinSlice;
  /* ran < slice * MAX without the product's overflow: floor(ran / MAX) < slice. */
  return ran_ns / FREERIDE_MAX_SLICES < slice_ns ? kExtendable : kSliceOver;
}

/* Whether the latest close the host has enqueued (`latest`, 0: none yet) has not executed:
 * `executed` is the slots as read, FREERIDE_CLOSE_SLOTS of them. */
FREERIDE_HOST_DEVICE bool close_pending(unsigned int latest, const unsigned int* executed) {
  return executed[latest & (FREERIDE_CLOSE_SLOTS - 1u)] != latest;
}

/* The whole decision at one claim, for the host's tests: the gate reads open and the
 * launch is within its slice, or past it with a close pending and within the bound. The
 * kernels make the same decision but read the close's words only when past the slice. */
FREERIDE_HOST_DEVICE bool may_claim(bool gate_open, unsigned long long ran_ns,
                                    unsigned long long slice_ns, unsigned int latest,
                                    const unsigned int* executed) {
  if (!gate_open) return false;
  const SliceTime t = slice_time(ran_ns, slice_ns);
  return t == kWithinSlice || (t == kExtendable && close_pending(latest, executed));
}

}  /* namespace freeride */

#endif /* FREERIDE_SLICE_H_ */
