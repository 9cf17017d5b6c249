"""The swarm: branches arriving at any time, served by one continuous-batching scheduler.

| module     | what                                                              |
|------------|-------------------------------------------------------------------|
| server.py  | Swarm: documents, submit(), stats(), the scheduler thread's owner |
| engine.py  | the step loop: admission, one llama_batch per step, sampling      |
| policy.py  | fifo, fair (round robin), priority with aging: plain Python       |
| work.py    | the records of documents and branches                             |
| handle.py  | BranchHandle (future + token stream), SwarmBranchResult           |
| stats.py   | SwarmStats; metrics.py: percentiles and Jain's index              |
"""

from __future__ import annotations

from .handle import BranchHandle, SwarmBranchResult, SwarmClosedError
from .policy import POLICIES, FairShare, Fifo, PriorityAging, make_policy
from .server import Swarm
from .stats import SwarmStats

__all__ = [
    "POLICIES",
    "BranchHandle",
    "FairShare",
    "Fifo",
    "PriorityAging",
    "Swarm",
    "SwarmBranchResult",
    "SwarmClosedError",
    "SwarmStats",
    "make_policy",
]
