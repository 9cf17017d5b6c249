"""Fan-out across machines on Ray (`pip install '.[dist]'`).

| module     | what                                                                |
|------------|---------------------------------------------------------------------|
| fanout.py  | RayFanout (workers that loaded the model once), run_on_ray          |
| worker.py  | BranchWorker: one actor's job, restore + local scheduler            |
| payload.py | a snapshot as a Ray object: zero-copy state view plus its header    |
| plan.py    | which worker runs which branches (connected groups, balanced)       |
| merge.py   | the workers' reports as one PipelineResult with `dist` timings      |

Importing this package does not import ray; RayFanout does, with a clear error when it is
missing. `import swarmkv` never imports this package.
"""

from __future__ import annotations

from .fanout import RAY_MODES, RayFanout, run_on_ray
from .plan import assign, branch_groups

__all__ = ["RAY_MODES", "RayFanout", "assign", "branch_groups", "run_on_ray"]
