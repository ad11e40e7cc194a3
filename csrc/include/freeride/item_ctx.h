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
  unsigned long long done; /* items finished (relaxed atomics, no fence: the host reads
                              it, and the items' results, after the launch ended) */
  unsigned int stop;       /* nonzero: stop claiming (cancel, preemption, shutdown) */
  unsigned int held;       /* blocks that stopped claiming because the gate was closed,
                              stop was set or their time slice ended; counts up, so the
                              host tells a launch that was paused from one whose kernel
                              skipped the item loop */
} fr_phase_state;

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
  unsigned long long slice_ns;           /* a block claims no item after running this
                                            long (the launch's time slice); 0: no limit */
} fr_item_ctx;

#endif /* FREERIDE_ITEM_CTX_H_ */
