"""The bubble record: what the training loop's gate writes measured (recorder), the
report built from it (model, report, trace, plot), live profiler ranges (profiler) and
reports gathered across ranks (ranks)."""

from .ranks import gather_reports, placement_table, stage_table
from .report import Report, merge_chrome_traces, merge_with_profiler_trace

__all__ = [
    "Report",
    "gather_reports",
    "merge_chrome_traces",
    "merge_with_profiler_trace",
    "placement_table",
    "stage_table",
]
