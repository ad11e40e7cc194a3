"""freeride: run side tasks in the bubbles of pipeline-parallel training.

import freeride as fr
with fr.Harvester(device="cuda:0", memory_budget="8GiB") as h:
    t = h.submit(fr.tasks.Spin(items=1000, ns_per_item=20_000))
    ...
"""

from . import integrations as integrations
from . import simulate, tasks
from ._moved import package_getattr as __getattr__  # noqa: F401 - old module paths
from .errors import (
    CudaFallbackWarning,
    CudaUnavailableError,
    FreerideError,
    HarvesterClosedError,
    KernelCompileError,
    MemoryBudgetError,
    QueueAuthError,
    RankLostError,
    StreamCaptureError,
    TaskCancelledError,
    TaskFailedError,
)
from .gate import Gate
from .handle import Handle, TaskHandle
from .harvester import Harvester
from .info import __version__, backend_info, include_dir
from .iterative import IterativeHandle, IterativeTask
from .job import JobClient, JobQueue, RemoteHandle
from .job.placement import Load, TaskSpec
from .record import (
    Report,
    gather_reports,
    merge_chrome_traces,
    merge_with_profiler_trace,
    placement_table,
    stage_table,
)
from .reserve import Reserve

__all__ = [
    "CudaFallbackWarning",
    "CudaUnavailableError",
    "FreerideError",
    "Gate",
    "Handle",
    "Harvester",
    "HarvesterClosedError",
    "IterativeHandle",
    "IterativeTask",
    "JobClient",
    "JobQueue",
    "KernelCompileError",
    "Load",
    "MemoryBudgetError",
    "QueueAuthError",
    "RankLostError",
    "RemoteHandle",
    "Report",
    "Reserve",
    "StreamCaptureError",
    "TaskCancelledError",
    "TaskFailedError",
    "TaskHandle",
    "TaskSpec",
    "__version__",
    "backend_info",
    "gather_reports",
    "include_dir",
    "merge_chrome_traces",
    "merge_with_profiler_trace",
    "placement_table",
    "simulate",
    "stage_table",
    "tasks",
]
