"""Exceptions raised by freeride."""


class FreerideError(Exception):
    """Base class of freeride's own errors."""


class MemoryBudgetError(FreerideError):
    """A side task needs more device memory than the harvester's ``memory_budget``."""


class TaskFailedError(FreerideError):
    """A side task raised or its launch failed; the message carries the cause."""


class TaskCancelledError(FreerideError):
    """``result()`` of a task that was cancelled (by ``cancel()`` or by ``close()``)."""


class HarvesterClosedError(FreerideError, RuntimeError):
    """The harvester was closed; it accepts no more work or gate writes."""


class CudaUnavailableError(FreerideError, RuntimeError):
    """A CUDA device was requested where freeride cannot use one: no usable device, or a
    driver that cannot run the build's kernels on it (the message names the build's
    toolkit, PTX ISA and architectures, the driver's CUDA version and what to do)."""


class KernelCompileError(FreerideError):
    """CUDA source given to ``fr.tasks.RawKernel`` did not compile, or lacks a kernel it
    names. ``log`` holds the compiler's output."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(f"{message}\n{log}".rstrip() if log else message)
        self.log = log


class RankLostError(FreerideError):
    """A rank of the job queue stopped answering (killed, crashed, or cut off): a task
    that ran there, or the queue itself if it was the queue's leader, cannot finish.
    ``rank`` names it."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


class QueueAuthError(FreerideError, PermissionError):
    """The secret given to ``fr.JobQueue.connect`` is not the job queue's: nothing was
    sent."""


class StreamCaptureError(FreerideError, RuntimeError):
    """submit() was called while a stream the new task must follow is being captured into
    a CUDA graph: the task's side stream would have to wait on that stream and so be
    pulled into the user's graph. Submit before or after the capture."""


class CudaFallbackWarning(RuntimeWarning):
    """``device="auto"`` chose the host backend on a machine with a GPU that freeride's
    CUDA backend cannot use (a build without it, a driver older than its runtime needs, or
    a driver that cannot run the build's kernels on the GPU: no machine code for it and
    PTX the driver cannot JIT). Issued once per process; the message names the driver,
    what the build needs and what to do. Passing ``device="cpu"`` chooses the host backend
    without it."""
