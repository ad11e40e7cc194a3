/* The layout shared by the host runtime, built-in kernels and user kernels compiled
 * with NVRTC. Plain C types only: NVRTC compiles it without a standard library. */
#ifndef FREERIDE_ITEM_CTX_H_
#define FREERIDE_ITEM_CTX_H_

#define FREERIDE_GATE_CLOSED 0u
#define FREERIDE_GATE_OPEN 1u

/* Per-phase counters of one task, in device memory. They outlive every launch of the
 * phase: a paused kernel exits, and the next launch resumes at `next`. */
typedef struct fr_phase_state {
  unsigned long long next; /* next item index to claim (may overshoot n_items) */
  unsigned long long done; /* items finished (relaxed atomics, releases with device
                              phases: the host learns the count from the launch's end
                              record, see fr_launch_end) */
  unsigned int stop;       /* nonzero: stop claiming (cancel, preemption, shutdown) */
  unsigned int held;       /* blocks that stopped claiming because the gate was closed,
                              stop was set or their time slice ended; counts up, so the
                              host tells a launch that was paused from one whose kernel
                              skipped the item loop */
} fr_phase_state;

/* One launch's own counters, in device memory: zero before the launch, and set back to
 * zero by its last block. Each launch of a runner has its own (a ring indexed by the
 * launch's number), so a launch never inherits what an earlier one left behind, and
 * launches queued ahead of the GPU need nothing cleared between them. */
typedef struct fr_launch_run {
  unsigned int exited;     /* blocks of the launch that have left it (leave_launch) */
  unsigned int closes_seen; /* the close slots as the launch's blocks found them when they
                               began, the earliest such look (freeride/slice.h:
                               closes_word); 0: none yet. A launch claims nothing once a
                               close has executed since (closed_since) */
  unsigned long long start; /* %globaltimer when the launch's first block started: every
                               block's time slice counts from there, so a block that
                               became resident late gets what is left of the slice */
  unsigned long long pending; /* past the slice: the blocks' shared answer to whether the
                                 close that ends the bubble is pending, and when it was
                                 read (freeride/slice.h: pending_word); 0: none yet */
} fr_launch_run;

/* What a launch writes to host-visible memory: its first block the start, its last
 * block, as it leaves, the rest. The host learns that the launch ended, its exact count
 * and its times from here, without putting anything on a stream behind a kernel that may
 * still run (an operation queued behind a running kernel holds everything behind it on
 * its hardware queue, and streams share those queues). `launch` is written last, after a
 * system-scope fence. */
typedef struct fr_launch_end {
  unsigned long long done;     /* the phase's `done` when the launch ended */
  unsigned long long held;     /* the phase's `held` then */
  unsigned long long start_ns; /* %globaltimer: the first block's start (written then) */
  unsigned long long end_ns;   /* %globaltimer: the last block's exit */
  unsigned long long blocks;   /* the launch's grid, in blocks (its item time: the host's
                                  estimate of how long a block spends on an item) */
  unsigned long long launch;   /* fr_item_ctx.launch of the launch that ended */
} fr_launch_end;

/* What every preemptible kernel receives as its first argument. */
typedef struct fr_item_ctx {
  const volatile unsigned int* gate;     /* the harvester's gate word */
  fr_phase_state* state;                 /* this phase's counters */
  volatile unsigned long long* progress; /* host-visible mirror of state->done, or 0:
                                            written when done reaches a multiple of
                                            freeride::kProgressEvery and at the last
                                            item, so it lags; informational only */
  unsigned long long n_items;            /* items in this phase */
  unsigned long long phase;              /* index of this phase within the task */
  unsigned long long slice_ns;           /* no block claims an item once the launch has
                                            run this long (its time slice), unless the
                                            close ending its bubble is pending (see
                                            freeride/slice.h); 0: no limit */
  volatile fr_launch_end* end;           /* host-visible end record, or 0 (plain runs) */
  unsigned long long launch;             /* this launch's number, written to end->launch */
  fr_launch_run* run;                    /* this launch's own counters (device memory) */
  const volatile unsigned int* latest_close; /* host-visible: the ordinal of the latest
                                                stream-ordered close the host enqueued,
                                                or 0: no launch runs past its slice */
  const volatile unsigned int* closes_executed; /* FREERIDE_CLOSE_SLOTS words, 16-byte
                                                   aligned: the ordinals closes wrote as
                                                   they executed (freeride/slice.h) */
  const volatile unsigned long long* after_done; /* the previous phase's `done`, or 0: a
                                                    launch chained behind that phase's at
                                                    an open claims nothing unless it reads
                                                    at least after_items (the phase is
                                                    complete) as its block begins */
  unsigned long long after_items;                /* items of the previous phase */
  unsigned long long phase_items; /* 0: the launch serves ctx.phase. Nonzero (device
                                     phases): it serves every phase of the task in
                                     order, each of phase_items items, from one claim
                                     counter: claim g is item g % phase_items of phase
                                     g / phase_items, n_items counts every phase's, and
                                     `phase` is 0. Only freeride::for_each_phase_item
                                     runs such a launch (it keeps the phases in order) */
  unsigned int next_close; /* a launch made at or for a stream-ordered open: the ordinal the
                              first close after that open gets (its bubble's close, or
                              an earlier one on another stream); once a close of that
                              ordinal or later has executed, the launch claims nothing
                              (freeride/slice.h: bubble_over). The executor's launches
                              for an open carry what was noted as it was written. 0:
                              none known (stream_wait, an open captured into a graph or
                              long forgotten): the launch goes by its first look */
  unsigned int max_slices; /* past its slice, a launch claims on while a close is pending
                              for at most this many slices from its start in all
                              (freeride/slice.h); 0: FREERIDE_MAX_SLICES. In what was
                              next_close's padding: the struct's size is unchanged */
} fr_item_ctx;

#endif /* FREERIDE_ITEM_CTX_H_ */
