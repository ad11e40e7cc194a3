// A deadline for SIGTERM while the process has its own SIGTERM handler that can only run
// later (the Python runtime's: its handlers run on the main thread between bytecodes, so
// a main thread blocked in native code, e.g. a collective whose peer is gone, would
// otherwise leave a SIGTERM unanswered until that code returns).
//
// arm() chains a handler in front of the one installed now: it notes the signal for a
// watchdog thread ("freeride-term") and calls the previous handler. If the process
// has neither ended nor called stand_down() `grace` seconds after a SIGTERM, the watchdog
// restores the default action and raises SIGTERM again: the process ends as it would
// have without any handler. A handler installed later (signal.signal) replaces the chain,
// and the watchdog then never hears of a SIGTERM.
#pragma once

namespace freeride::sigterm_guard {

// Chains over the SIGTERM handler installed now and starts the watchdog. False, with
// nothing changed, where the current disposition is the default or ignore (no handler to
// give time to) or where already armed. Linux only (false elsewhere).
bool arm(double grace_s);

// The process's own handler has started its shutdown, which ends the process itself:
// the watchdog lets it be.
void stand_down();

// Stops and joins the watchdog and, if the chain is still the installed handler, puts
// back the previous handler, or with `restore_default` SIGTERM's default action (for a
// caller that cannot tell the runtime, e.g. Python off its main thread). Idempotent; any
// thread.
void disarm(bool restore_default);

bool armed();

}  // namespace freeride::sigterm_guard
