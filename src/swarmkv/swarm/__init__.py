"""The swarm: branches arriving at any time, served by one continuous-batching scheduler.

| module     | what                                                              |
|------------|-------------------------------------------------------------------|
| server.py  | Swarm: documents, submit(), stats(), the engine's worker thread   |
| handle.py  | BranchHandle: a future of the branch's BranchResult + its tokens  |
| stats.py   | SwarmStats; metrics.py: percentiles and Jain's index              |

The step loop (admission, one llama_batch per step, sampling) is the engine's
(engine/core.py), and the policies are in engine/policy.py: the swarm adds a thread, handles
and statistics.
"""

from __future__ import annotations

from ..engine.policy import POLICIES, FairShare, Fifo, PriorityAging, make_policy
from ..engine.result import BranchResult
from ..errors import ClosedError
from .handle import BranchHandle
from .server import Swarm
from .stats import SwarmStats

__all__ = [
    "POLICIES",
    "BranchHandle",
    "BranchResult",
    "ClosedError",
    "FairShare",
    "Fifo",
    "PriorityAging",
    "Swarm",
    "SwarmStats",
    "make_policy",
]
