"""`python -m swarmkv_bench ...`: the same as `swarmkv bench ...`."""

from __future__ import annotations

import sys

from swarmkv.cli.app import main

if __name__ == "__main__":
    raise SystemExit(main(["bench", *sys.argv[1:]]))
