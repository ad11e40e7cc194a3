// freeride's item protocol for preemptible kernels. A user kernel writes only the body
// of one item:
//
//   #include <freeride/preempt.cuh>
//   extern "C" __global__ void scale(fr_item_ctx ctx, float* x, float a, unsigned long long n) {
//     freeride::for_each_item(ctx, [&](unsigned long long item) {
//       unsigned long long i = item * blockDim.x + threadIdx.x;
//       if (i < n) x[i] *= a;
//     });
//   }
//
// Before claiming each item, the block's leader reads the gate (and the phase's stop
// flag, and whether a close has executed since the launch began: a launch never runs in
// two bubbles, freeride/slice.h); if side work must not run, the whole block exits. A
// claimed item always runs to completion, so an exited kernel has lost nothing and the
// next launch of the same phase resumes at the next unclaimed item: every item runs
// exactly once.
//
// What an item costs (for_each_item), per block: one __syncthreads, and for the leader
// thread four volatile loads issued together (the gate, the stop flag, the launch's
// first look at the close slots, in its own counters, and the slots, on the gate's line),
// a relaxed atomicAdd on `next` (the claim), one on `done` (the count) and, every
// kProgressEvery items, a store to the host-visible progress mirror. The leader claims the next item
// as soon as its own part of the current one is done, into the one of two shared slots
// that the current item was not read from; after the barrier every thread has finished
// the current item, so the leader counts it then and the block goes on to the next. No
// item is claimed before the leader finished its part of the one before it (no claim
// runs ahead of the item in flight): a close that lands after the leader read the gate
// lets one more item start, so a block exits at most one item (plus what the other
// threads still had left of the current one at that read) after a close.
//
// How the host learns that a launch ended: nothing is put on a stream behind the kernel
// (an operation queued behind a running kernel, even an event or a 16-byte copy, holds
// everything behind it on its hardware queue until the kernel ends, and streams share
// those queues: one under CUDA_DEVICE_MAX_CONNECTIONS=1). Instead every block counts
// itself out as it leaves (leave_launch), and the last one writes the phase's exact
// `done`, `held` and the launch's times to the host-visible end record and then the
// launch's number, after a system-scope fence. Each block's leader fences the block's
// writes (after a barrier) before it counts the block out, so once the host reads the
// number, the items' results are visible to any later work on the device. Inside the loop
// there is no fence (with device phases, below, a release per count and an acquire at a
// phase boundary): the progress mirror, what Executor::status reports while a launch
// runs, is written when `done` reaches a multiple of kProgressEvery and at the phase's
// last item; it may lag, and items_done read from it orders nothing (count_finished says
// what would need one).
//
// A task whose phases all run one kernel with as many items each may serve every phase
// from one launch (device phases, FREERIDE_DEVICE_PHASES: ctx.phase_items): its kernel
// uses for_each_phase_item, whose body takes the phase with the item, and the launch goes
// on from one phase to the next on the device, keeping them in order (item_loop), so a
// launch queued at an open serves whatever phase is current when its bubble comes. That
// costs a release per count (a memory barrier before the leader's atomic) and an acquire
// at each phase boundary a block crosses.
//
// A launch's time slice counts from its first block's start (enter_launch): a block that
// becomes resident only when an earlier one leaves gets what is left of the slice, so a
// launch ends about one slice (plus an item, two where a block crosses a phase boundary
// of device phases) after it started, whatever its grid, unless the close that ends its
// bubble is pending by then: then it runs until that close, for at most
// fr_item_ctx.max_slices slices in all (freeride/slice.h has the rule and why). A
// launch's own counters (fr_launch_run) are its alone, so launches queued back to back on
// a stream need nothing reset between them.
#pragma once

#include "item_ctx.h"
#include "slice.h"

namespace freeride {

constexpr unsigned long long kNoItem = ~0ull;

// The progress mirror is written when `done` reaches a multiple of this (and at the
// phase's last item) rather than every item: it crosses the bus, and the host only shows
// it. A power of two, so the test is a mask.
constexpr unsigned long long kProgressEvery = 8ull;
static_assert((kProgressEvery & (kProgressEvery - 1ull)) == 0ull && kProgressEvery != 0ull,
              "kProgressEvery must be a power of two");

__device__ __forceinline__ bool leader_thread() {
  return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
}

// Leader only: `word`, addressed so that ptxas does not aggregate an atomic on it across
// the warp. On an address the same in every lane, ptxas turns atomicAdd into a vote, one
// atomic and a shuffle of its result to the lanes, and the shuffle waits for the atomic's
// round trip right there, however much later the result is used. The leader is lane 0
// (thread (0,0,0) is the first of warp 0), so adding its lane index changes nothing but
// makes the address look per lane; the atomic stays one thread's.
__device__ __forceinline__ unsigned long long* leader_word(unsigned long long* word) {
  unsigned int lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  return word + lane;
}

// May side work start now? One volatile read each of the gate and the stop flag, by the
// block's leader only (claim_item), once per item: the other threads learn the answer
// through shared memory. Both loads are issued before either value is compared, so they
// cost one round trip, not two (one asm block: no compiler puts a compare between them).
// Volatile loads skip L1, so the gate is read from L2 (device memory, where a close
// written on the training stream lands first). A harvester made with
// gate_in_host_memory=True hands kernels the mapped host word instead: then each read
// crosses the bus, still one per block per item (a close there is a host store, or a
// stream write into host memory, with nothing on the device to copy it to).
__device__ __forceinline__ bool may_run(const fr_item_ctx& ctx) {
  unsigned int gate;
  unsigned int stop;
  asm volatile(
      "ld.volatile.global.u32 %0, [%2];\n\t"
      "ld.volatile.global.u32 %1, [%3];"
      : "=r"(gate), "=r"(stop)
      : "l"(__cvta_generic_to_global(const_cast<const unsigned int*>(ctx.gate))),
        "l"(__cvta_generic_to_global(&ctx.state->stop))
      : "memory");
  return (gate == FREERIDE_GATE_OPEN) & (stop == 0u);
}

// The close slots (freeride/slice.h), one 16-byte volatile load: device memory, on the
// gate's own line (mapped host memory with the gate there).
__device__ __forceinline__ void load_close_slots(const fr_item_ctx& ctx,
                                                 unsigned int (&executed)[FREERIDE_CLOSE_SLOTS]) {
  static_assert(FREERIDE_CLOSE_SLOTS == 4u, "one 16-byte load reads every slot");
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(executed[0]), "=r"(executed[1]), "=r"(executed[2]), "=r"(executed[3])
               : "l"(__cvta_generic_to_global(const_cast<const unsigned int*>(ctx.closes_executed)))
               : "memory");
}

// may_run, and the launch's bubble not over (freeride/slice.h: no close executed since
// its first look, closed_since, nor its bubble's own close, bubble_over):
// the gate, the stop flag, the launch's earliest look at the close slots and the slots
// now, all four loads issued together (one round trip, as may_run's two; with the gate
// in mapped host memory the slots are there too, and the round trip crosses the bus).
// Volatile loads are not ordered among themselves: where a close and the next open both
// take effect between two claims, a block may read the open's gate with slots from
// before the close, and claim one more item, in the next bubble; its next claim reads
// the close. That is one item per block, like an item in flight at a close, bought to
// keep one round trip a claim (an acquire load of the gate before the slots would make
// it two).
__device__ __forceinline__ bool may_run_in_bubble(const fr_item_ctx& ctx) {
  if (ctx.closes_executed == 0) return may_run(ctx);
  unsigned int gate;
  unsigned int stop;
  unsigned int seen;
  unsigned int executed[FREERIDE_CLOSE_SLOTS];
  asm volatile(
      "ld.volatile.global.u32 %0, [%7];\n\t"
      "ld.volatile.global.u32 %1, [%8];\n\t"
      "ld.volatile.global.u32 %2, [%9];\n\t"
      "ld.volatile.global.v4.u32 {%3, %4, %5, %6}, [%10];"
      : "=r"(gate), "=r"(stop), "=r"(seen), "=r"(executed[0]), "=r"(executed[1]),
        "=r"(executed[2]), "=r"(executed[3])
      : "l"(__cvta_generic_to_global(const_cast<const unsigned int*>(ctx.gate))),
        "l"(__cvta_generic_to_global(&ctx.state->stop)),
        "l"(__cvta_generic_to_global(&ctx.run->closes_seen)),
        "l"(__cvta_generic_to_global(const_cast<const unsigned int*>(ctx.closes_executed)))
      : "memory");
  return (gate == FREERIDE_GATE_OPEN) & (stop == 0u) & !closed_since(seen, executed) &
         !bubble_over(ctx.next_close, executed);
}

// %globaltimer: nanoseconds, the same clock on every SM.
__device__ __forceinline__ unsigned long long globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// How long the launch has run, from its start as enter_launch returned it. Saturating: the
// start is whichever block's stamp won the race, so a block that lost it may read the
// clock a moment below that stamp, and an unsigned difference would wrap to past the
// bound (the block would leave at its first claim).
__device__ __forceinline__ unsigned long long ran_since(unsigned long long started_ns) {
  const unsigned long long now = globaltimer_ns();
  return now > started_ns ? now - started_ns : 0ull;
}

// Leader only, once per block as it starts: the launch's start on %globaltimer, taken by
// the first block to get here (every block's time slice counts from it). That block also
// writes it to the host-visible end record: the host then knows the launch has begun
// (a launch queued ahead of the GPU waits for its bubble first; a cancel counts on it to
// tell whether any launch can still run an item). A kernel that claims without
// for_each_item must call it before its first claim.
//
// Every block also looks at the close slots as it begins, and the launch keeps the
// earliest look (closes_word falls as closes execute: an atomic max), so that no block
// claims once a close has executed since the launch began (may_run_in_bubble).
__device__ __forceinline__ unsigned long long enter_launch(const fr_item_ctx& ctx) {
  if (ctx.closes_executed != 0) {
    unsigned int executed[FREERIDE_CLOSE_SLOTS];
    load_close_slots(ctx, executed);
    atomicMax(&ctx.run->closes_seen, closes_word(executed));
  }
  const unsigned long long now = globaltimer_ns();
  const unsigned long long first = atomicCAS(&ctx.run->start, 0ull, now);
  if (first != 0ull) return first;
  if (ctx.end != 0) ctx.end->start_ns = now;
  return now;
}

// Every thread of the block, once, as the block leaves the launch (for_each_item calls
// it; a kernel that does not use for_each_item but claims through ctx.state must too).
// After the barrier the leader fences at device scope and counts the block out: fences
// are cumulative, so the fence orders every thread's writes that the barrier ordered
// before it, not only the leader's (one fence per block, where a fence in every thread
// before the barrier would order the same at blockDim times the cost). The last block
// out publishes the end record (see the top of this file) and sets the launch's own
// counters back.
__device__ __forceinline__ void leave_launch(const fr_item_ctx& ctx) {
  __syncthreads();
  if (!leader_thread()) return;
  __threadfence();
  const unsigned int blocks = gridDim.x * gridDim.y * gridDim.z;
  if (atomicAdd(&ctx.run->exited, 1u) != blocks - 1u) return;
  __threadfence();  // every other block's counts (and results) before what is read here
  volatile fr_phase_state* state = ctx.state;
  volatile fr_launch_run* run = ctx.run;
  const unsigned long long done = state->done;
  const unsigned long long held = state->held;
  const unsigned long long start = run->start;
  run->exited = 0u;
  run->closes_seen = 0u;
  run->start = 0ull;
  run->pending = 0ull;
  if (ctx.end == 0) return;
  ctx.end->done = done;
  ctx.end->held = held;
  ctx.end->start_ns = start;
  ctx.end->end_ns = globaltimer_ns();
  ctx.end->blocks = blocks;
  __threadfence_system();  // the record, then its number: the host reads it in that order
  ctx.end->launch = ctx.launch;
}

// Leader only, past the launch's time slice: whether the close that ends the current
// bubble is pending (freeride/slice.h), read across the bus: the latest close's ordinal
// (host memory) and the slots of the ordinals executed (device memory), both loads issued
// together, so one round trip.
__device__ __forceinline__ bool read_close_pending(const fr_item_ctx& ctx) {
  unsigned int latest;
  unsigned int executed[FREERIDE_CLOSE_SLOTS];
  asm volatile(
      "ld.volatile.global.u32 %0, [%5];\n\t"
      "ld.volatile.global.v4.u32 {%1, %2, %3, %4}, [%6];"
      : "=r"(latest), "=r"(executed[0]), "=r"(executed[1]), "=r"(executed[2]),
        "=r"(executed[3])
      : "l"(__cvta_generic_to_global(const_cast<const unsigned int*>(ctx.latest_close))),
        "l"(__cvta_generic_to_global(const_cast<const unsigned int*>(ctx.closes_executed)))
      : "memory");
  return close_pending(latest, executed);
}

// Leader only: waits until the shared answer's word is no longer `seen` (a refresh in
// flight whose old answer is too old to use: freeride/slice.h, waits_for_refresh), then
// the answer it then holds (published, or taken for the next refresh with that answer's
// bit kept). A read always returns, so this ends; FREERIDE_PENDING_WAIT_NS is a guard,
// after which the block stops as it did before.
__device__ __forceinline__ bool wait_for_refresh(unsigned long long* word,
                                                 unsigned long long seen,
                                                 unsigned long long now) {
  unsigned long long w = seen;
  while (w == seen && globaltimer_ns() - now < FREERIDE_PENDING_WAIT_NS) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    __nanosleep(256);
#endif
    w = *const_cast<volatile unsigned long long*>(word);
  }
  return w != seen && (w & FREERIDE_PENDING_BIT) != 0ull;
}

// Leader only, past the launch's time slice: whether the close that ends the current
// bubble is pending, through the launch's shared answer (freeride/slice.h: at most one
// block reads across the bus per freshness window, however many blocks claim). `read`
// says this block read it itself just now, which may have taken long: the caller reads
// the gate again before it claims on that answer.
__device__ __forceinline__ bool close_pending(const fr_item_ctx& ctx, bool& read) {
  read = false;
  if (ctx.latest_close == 0) return false;
  unsigned long long* word = &ctx.run->pending;
  const unsigned long long now = globaltimer_ns();
  const unsigned long long seen = *const_cast<volatile unsigned long long*>(word);
  if (waits_for_refresh(seen, now)) {
    read = true;  // time passes: the caller reads the gate again
    return wait_for_refresh(word, seen, now);
  }
  const PendingLook look = look_at_pending(seen, now);
  if (!look.refresh) return look.answer;
  const unsigned long long was = atomicCAS(word, seen, look.kept);
  if (was != seen) {
    // Another block took the refresh a moment before: its word keeps the old answer's
    // stamp, which may be too old to use (blocks that look together, items longer than
    // two windows), and then this block waits for that refresh too.
    if (!waits_for_refresh(was, now)) return pending_answer(was, now);
    read = true;
    return wait_for_refresh(word, was, now);
  }
  const bool pending = read_close_pending(ctx);
  // Stamped as it lands, so that a slow read does not land already too old to use and
  // send every block to wait for the next one (a claim then rests on an answer at most two
  // windows plus this read old, the bound freeride/slice.h states). Over the word this
  // block put in only (nothing else replaces an in-flight word; the launch's last block
  // clears it after every block has left).
  atomicCAS(word, look.kept, pending_word(pending, globaltimer_ns()));
  read = true;
  return pending;
}

// Leader only, as the block begins: whether the launch may claim items of its phase. A
// launch chained behind the previous phase's at an open (ctx.after_done set) may not
// unless that phase is complete. Read once per block, from L2 (ld.global.cg): launches of
// one runner run one after another on one stream, so the count cannot move while this
// launch runs, and the kernel boundary made it, and the phase's results, visible. A block
// that may not claims nothing and is counted in `held` (claim_item), as a paused one is:
// the launch's phase is not finished and nothing is wrong with its kernel.
__device__ __forceinline__ bool phase_ready(const fr_item_ctx& ctx) {
  if (ctx.after_done == 0) return true;
  return __ldcg(const_cast<const unsigned long long*>(ctx.after_done)) >= ctx.after_items;
}

// Leader only: claim the next item, or kNoItem when paused, out of time, the phase is
// drained or (`ready` false) the phase before is not complete (phase_ready: for_each_item
// reads it once per block). The item loop's own: it also claims in launches with device
// phases, which only for_each_phase_item may run; a kernel that claims by itself calls
// the overload below, which refuses those. A block held back by the gate, the stop flag
// or the end of the launch's time
// (freeride/slice.h: the slice, or past it no close pending, or the bound on running on)
// says so in `held` (once, as it exits): a device-wide synchronisation the host issues
// (torch.cuda.synchronize, cudaFree) while it has not enqueued the close of the bubble
// waits at most a slice, and between launches the executor may pick another task. The
// claim rests on a gate read no older than any read across the bus it made: after one,
// the gate is read again (a close that landed meanwhile stops the block now, not an item
// later).
__device__ __forceinline__ unsigned long long claim_item(const fr_item_ctx& ctx,
                                                         unsigned long long started_ns,
                                                         bool ready) {
  bool in_time = ready && may_run_in_bubble(ctx);
  if (in_time) {
    const SliceTime t = slice_time(ran_since(started_ns), ctx.slice_ns, ctx.max_slices);
    if (t != kWithinSlice) {
      bool read = false;
      in_time = t == kExtendable && close_pending(ctx, read);
      // After a read (or a wait for one) time has passed: the gate and the bound again.
      if (in_time && read) {
        in_time = may_run_in_bubble(ctx) &&
                  slice_time(ran_since(started_ns), ctx.slice_ns, ctx.max_slices) == kExtendable;
      }
    }
  }
  if (!in_time) {
    atomicAdd(&ctx.state->held, 1u);
    return kNoItem;
  }
  // Relaxed, device scope (atomicAdd): the claim orders nothing but itself.
  const unsigned long long item = atomicAdd(leader_word(&ctx.state->next), 1ull);
  return item < ctx.n_items ? item : kNoItem;
}

// The same for a kernel that claims without for_each_item: the phase-before check at every
// claim (a chained launch's count cannot move while it runs, so the answer is the same
// each time; a launch that is not chained pays only a test of its parameter). In a launch
// with device phases (ctx.phase_items) it claims nothing and holds no block back, as
// for_each_item does: such a kernel would take later phases' items for ctx.phase's, and
// the host fails its task saying so.
__device__ __forceinline__ unsigned long long claim_item(const fr_item_ctx& ctx,
                                                         unsigned long long started_ns) {
  if (ctx.phase_items != 0ull) return kNoItem;
  return claim_item(ctx, started_ns, phase_ready(ctx));
}

// Leader only, after the whole block finished an item (a __syncthreads in between):
// count it. Returns `done` as it was before this item (the atomic's old value; for_each_item
// adds the 1 only where it uses the value, so nothing waits for the atomic's round trip
// before then). A relaxed device-scope atomicAdd, and no fence before it: nothing reads
// `done` or the items' results while the launch runs (the host reads both after it
// ended, behind the kernel in stream order, and a kernel's end makes all its writes
// visible), and the barrier already ordered the block's writes before the leader's
// atomic at block scope. Something that consumed results during a launch on the
// strength of `done` or the mirror (a host thread reading mapped memory, a concurrent
// kernel) would need a release at its scope here: __threadfence_system() before a count
// the host polls.
// With device phases other blocks do read `done` during the launch
// (wait_for_phases_before): item_loop counts with count_finished_release there.
__device__ __forceinline__ unsigned long long count_finished(const fr_item_ctx& ctx) {
  return atomicAdd(leader_word(&ctx.state->done), 1ull);
}

// Leader only: write `done` (a count_finished value plus one) to the host-visible
// progress mirror if it is a multiple of kProgressEvery or the phase's last item. Stores
// from different blocks may land out of order; the host takes the maximum, and the
// exact count it reads back after each launch.
__device__ __forceinline__ void publish_progress(const fr_item_ctx& ctx,
                                                 unsigned long long done) {
  if (ctx.progress != nullptr &&
      ((done & (kProgressEvery - 1ull)) == 0ull || done == ctx.n_items)) {
    *ctx.progress = done;
  }
}

// Leader only, after the whole block finished an item: publish its completion (both of
// the above at once, waiting for the atomic; for_each_item splits them so that the
// round trip overlaps the next item).
__device__ __forceinline__ void finish_item(const fr_item_ctx& ctx) {
  publish_progress(ctx, count_finished(ctx) + 1ull);
}

// Leader only, device phases (ctx.phase_items): count_finished as a release at device
// scope (atom.release.gpu), so that a block that reads the count and then acquires
// (wait_for_phases_before) sees the item's results too. It comes after the block barrier
// that ended the item, and a release covers what precedes it in causality order, every
// thread's writes that barrier ordered included: the pattern of CUTLASS's GenericBarrier
// (a barrier, then one thread's release; one thread's acquire, then a barrier).
__device__ __forceinline__ unsigned long long count_finished_release(const fr_item_ctx& ctx) {
  unsigned long long before;
  asm volatile("atom.release.gpu.global.add.u64 %0, [%1], 1;"
               : "=l"(before)
               : "l"(__cvta_generic_to_global(leader_word(&ctx.state->done)))
               : "memory");
  return before;
}

// Leader only: count the item the block finished, with a release where device phases
// need one.
__device__ __forceinline__ unsigned long long count_item(const fr_item_ctx& ctx, bool release) {
  return release ? count_finished_release(ctx) : count_finished(ctx);
}

// Leader only, device phases: waits until every item of the phases before `phase` has
// been counted, then acquires at device scope (the count read strongly, then a
// fence.acq_rel: an acquire pattern of the PTX memory model, one memory barrier and L1
// invalidation per wait where an ld.acquire would invalidate L1 at every look), so that
// after the block barrier that follows (item_loop), every thread of the block sees those
// items' results (the counts were releases: count_finished_release). The wait is bounded
// by two items (and a claim's wait for a refresh, close_pending): whatever of
// those phases is not yet counted is claimed, so it runs in a resident block of this
// launch (launches of a task run one after another on its stream, and an ended launch
// left no claim unfinished); no block waits here holding an item it has not counted; and
// a grid of at most one phase's items (grid_items) holds claims of at most two phases.
__device__ __forceinline__ void wait_for_phases_before(const fr_item_ctx& ctx,
                                                       unsigned long long phase) {
  const unsigned long long need = phase * ctx.phase_items;
  const size_t done = __cvta_generic_to_global(&ctx.state->done);
  while (true) {
    unsigned long long seen;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(seen) : "l"(done) : "memory");
    if (seen >= need) break;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    __nanosleep(128);  // fewer loads beside the counts they wait for
#endif
  }
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

// for_each_item and for_each_phase_item: the one loop (kPhases: the body takes the phase
// too, and a launch with device phases runs).
//
// One barrier per item: the leader claims item k+1 as soon as its own part of item k is
// done, into the shared slot item k was not read from (a slower thread may still be
// about to read item k's); the barrier that follows means every thread finished item k,
// so the leader counts it then and offers the count to the progress mirror after its
// part of item k+1, so that nothing waits for the atomic's round trip (ptxas would
// otherwise shuffle or copy the result right after the atomic: see leader_word; checked
// in the SASS of the built-in kernels with CUDA 13). When the claim says kNoItem the
// leader counts and publishes the last item before the block returns.
//
// With device phases a claim may be of a later phase than the block's last: the block
// first waits, after counting its own last item, until the phases before it are counted
// (wait_for_phases_before, and a second barrier: only at such a step, which is uniform
// across the block), and each count is a release. A close that lands while a block
// waits there lets it run that one item after the wait: at a phase boundary a block
// leaves up to two items after a close instead of one.
template <bool kPhases, typename Body>
__device__ __forceinline__ void item_loop(const fr_item_ctx& ctx, Body&& body) {
  if (ctx.state == 0) {
    for (unsigned long long item = blockIdx.x; item < ctx.n_items; item += gridDim.x) {
      body(ctx.phase, item);
      __syncthreads();  // as between claimed items: the body may reuse shared memory
    }
    return;
  }
  __shared__ unsigned long long s_item[2];
  const bool leader = leader_thread();
  // for_each_item in a launch with device phases claims nothing, and holds no block
  // back: the host then fails the task with the reason (its body would take items of
  // later phases for ctx.phase's).
  const bool refuse = !kPhases && ctx.phase_items != 0ull;
  const bool device_phases = kPhases && ctx.phase_items != 0ull;
  const unsigned long long started_ns = leader ? enter_launch(ctx) : 0ull;
  const bool ready = leader && phase_ready(ctx);
  bool ran = false;  // the previous pass ran an item: the leader counts it after the barrier
  unsigned int slot = 0;
  // Device phases: the block's phase and its claims [first, end), every thread's copy.
  unsigned long long phase = ctx.phase;
  unsigned long long first = 0;
  unsigned long long end = ctx.phase_items;
  while (true) {
    if (leader) s_item[slot] = refuse ? kNoItem : claim_item(ctx, started_ns, ready);
    __syncthreads();  // every thread finished the previous item; s_item[slot] is set
    unsigned long long item = s_item[slot];
    const bool count = leader && ran;
    if (item == kNoItem) {  // uniform across the block
      if (count) publish_progress(ctx, count_item(ctx, device_phases) + 1ull);
      leave_launch(ctx);
      return;
    }
    unsigned long long before = 0;  // `done` before the count (count_finished)
    if (count) before = count_item(ctx, device_phases);
    ran = true;
    if (device_phases) {
      // A block's claims only grow: past `end` is a later phase (the first claim of a
      // launch may be any number of phases on). Uniform: every thread read the claim.
      if (item >= end) {
        phase = item / ctx.phase_items;
        first = phase * ctx.phase_items;
        end = first + ctx.phase_items;
        if (leader) wait_for_phases_before(ctx, phase);
        __syncthreads();
      }
      item -= first;
    }
    body(phase, item);
    // The count's result is used only now, an item after the atomic was issued.
    if (count) publish_progress(ctx, before + 1ull);
    slot ^= 1u;
  }
}

// Runs body(item) for every item this block claims until the gate closes, the phase is
// stopped, the launch's time slice ends or no item is left. Every thread of the block
// must call it (it synchronises); the body may use shared memory and __syncthreads:
// consecutive items are separated by a block barrier.
//
// Call it once per block per launch: the block leaves the launch when it returns.
//
// A context without phase state (ctx.state == 0) runs the kernel plain: every item, in a
// grid-stride loop, with no gate, claims or counters. The item-overhead benchmark
// compares the two modes of the same kernel this way.
template <typename Body>
__device__ __forceinline__ void for_each_item(const fr_item_ctx& ctx, Body&& body) {
  item_loop<false>(ctx, [&](unsigned long long, unsigned long long item) { body(item); });
}

// The same, with the item's phase: body(phase, item). In a launch of one phase the phase
// is ctx.phase; in a launch with device phases (ctx.phase_items: a task that serves every
// phase from one launch, FREERIDE_DEVICE_PHASES) the launch goes on from phase to phase
// in order, each phase's items all finished before any item of the next starts, as
// separate launches would, for ordinary loads and stores (not read-only-cache loads,
// ld.global.nc from const __restrict__ pointers or __ldg, nor textures: their data must
// not change during the launch). There ctx.phase is 0 and ctx.n_items counts every
// phase's items. A kernel that takes its phase from here rather than from ctx.phase runs
// either way.
template <typename Body>
__device__ __forceinline__ void for_each_phase_item(const fr_item_ctx& ctx, Body&& body) {
  item_loop<true>(ctx, body);
}

}  // namespace freeride
