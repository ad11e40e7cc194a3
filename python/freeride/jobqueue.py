"""Deprecated module path: the job queue lives in freeride.job (fr.JobQueue)."""

from .job import JobClient, JobQueue, RemoteHandle

__all__ = ["JobClient", "JobQueue", "RemoteHandle"]
