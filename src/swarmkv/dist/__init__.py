"""Fan-out across machines on Ray, and `swarmkv serve` on Ray Serve replicas
(`pip install '.[dist]'`).

| module            | what                                                                |
|-------------------|---------------------------------------------------------------------|
| fanout.py         | RayFanout (workers that loaded the model once), run_on_ray          |
| worker.py         | BranchWorker: one actor's job, restore + local scheduler            |
| payload.py        | a snapshot as a Ray object: zero-copy state view plus its header    |
| plan.py           | which worker runs which branches (connected groups, balanced)       |
| merge.py          | the workers' reports as one PipelineResult with `dist` timings      |
| serve_options.py  | `swarmkv serve --ray-replicas`'s settings (plain data)              |
| serve_replicas.py | the Serve application: deploy, serve, take down (ServedReplicas)    |
| serve_ingress.py  | the ingress: the server's FastAPI app over the engine replicas      |
| serve_engine.py   | an engine replica: the server's Runtime in a Serve replica          |
| prefix_router.py  | Serve request routers: prefix affinity, round-robin                 |
| affinity.py       | the affinity router's choice (plain Python)                         |
| prefix_record.py  | the affinity router's record of prefixes sent per replica           |
| router_stats.py   | where the ingress reads its replicas' status                        |

Importing this package does not import ray; RayFanout does, with a clear error when it is
missing. serve_ingress and prefix_router import Ray Serve as they load: only `swarmkv serve
--ray-replicas` (and the deployments it starts) imports them. `import swarmkv` never imports
this package.
"""

from __future__ import annotations

from .fanout import RAY_MODES, RayFanout, run_on_ray
from .plan import assign, branch_groups

__all__ = ["RAY_MODES", "RayFanout", "assign", "branch_groups", "run_on_ray"]
