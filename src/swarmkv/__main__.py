"""`python -m swarmkv`: the same command as the `swarmkv` console script."""

from __future__ import annotations

from swarmkv.cli.app import main

if __name__ == "__main__":
    raise SystemExit(main())
