"""The job-wide side-task queue: ranks (and outside clients with the queue's secret)
submit TaskSpecs; a coordinator on the leader rank places each on the rank with the most
bubble time.

queue.py        JobQueue, the per-rank face (setup, submit, close, abort, heartbeat)
agent.py        a rank's agent: runs placed tasks, reports states and results
coordinator.py  the leader's placement loop, liveness and close
client.py       JobClient, for processes that are not ranks
handle.py       RemoteHandle, the submitter's view of a task
channel/        the leader's Hub and each peer's Link: CurveZMQ, ZAP, mutual authentication
liveness.py     how often ranks and the hub show they are alive, by the job's size
auth.py         the secret and the challenge-response proofs
files.py        the secret file (written 0600, read with O_NOFOLLOW and fstat checks)
messages.py     the messages and their shapes
"""

from .client import JobClient
from .handle import RemoteHandle
from .queue import JobQueue

__all__ = ["JobClient", "JobQueue", "RemoteHandle"]
