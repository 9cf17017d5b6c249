"""`python -m swarmkv`: the same command as the `swarmkv` console script."""

from __future__ import annotations

from swarmkv.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
