#!/usr/bin/env python3
"""Decide the build's backend and CPU settings; CMakeLists.txt runs this at configure time.

Inputs are three environment variables (pyproject.toml forwards them as CMake definitions,
which CMake passes on the command line):

| variable     | values            | default | meaning                                    |
|--------------|-------------------|---------|--------------------------------------------|
| SWARMKV_CUDA | auto, 1/on, 0/off | auto    | auto: CUDA iff nvcc exists and a GPU seen  |
| SWARMKV_CPU  | native, portable  | native  | -march=native, or ggml's runtime variants  |
| SWARMKV_AMX  | 0/off, 1/on       | 0       | ggml's AMX kernels (crash: CMakeLists.txt) |

`auto` needs both a toolkit (a CUDA build without a GPU only costs build time) and a GPU
(`nvidia-smi -L` lists one): a toolkit alone is common on CPU machines and images.

Prints one `key=value` per line (cuda, cpu, amx, reason) for CMake, and exits 2 with one line
on stderr for a value it does not know.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TRUE = {"1", "on", "yes", "true"}
FALSE = {"0", "off", "no", "false"}
CPU_MODES = ("native", "portable")


class ChoiceError(ValueError):
    pass


@dataclass(frozen=True)
class BuildChoice:
    cuda: bool
    cpu: str
    amx: bool
    reason: str

    def lines(self) -> str:
        flag = {True: "ON", False: "OFF"}
        return (
            f"cuda={flag[self.cuda]}\ncpu={self.cpu}\namx={flag[self.amx]}\nreason={self.reason}\n"
        )


def parse_flag(name: str, value: str | None, *, allow_auto: bool = False) -> bool | None:
    """Return True/False for a switch, None for `auto` (or unset, when auto is allowed)."""
    text = (value or "").strip().lower()
    if text in TRUE:
        return True
    if text in FALSE:
        return False
    if allow_auto and text in {"", "auto"}:
        return None
    if not allow_auto and text == "":
        return False
    allowed = "auto, 1, 0" if allow_auto else "1, 0"
    raise ChoiceError(f"{name}={value!r} is not one of {allowed} (on/off/yes/no also work)")


def find_nvcc(env: dict[str, str]) -> str | None:
    """The CUDA compiler CMake would find: CUDACXX, PATH, then the usual toolkit folders."""
    if env.get("CUDACXX"):
        return env["CUDACXX"] if Path(env["CUDACXX"]).exists() else None
    found = shutil.which("nvcc", path=env.get("PATH"))
    if found:
        return found
    for root in (env.get("CUDA_HOME"), env.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "nvcc").exists():
            return str(Path(root) / "bin" / "nvcc")
    return None


def list_gpus() -> list[str]:
    """GPUs that `nvidia-smi -L` lists (no driver or no GPU: an empty list)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if proc.returncode != 0:
        return []
    return [line.strip() for line in proc.stdout.splitlines() if line.startswith("GPU ")]


def decide_cuda(setting: bool | None, nvcc: str | None, gpus: list[str]) -> tuple[bool, str]:
    """The CUDA decision and its reason, from the override and the two probes."""
    if setting is True:
        return True, "SWARMKV_CUDA=1 forces the CUDA backend"
    if setting is False:
        return False, "SWARMKV_CUDA=0 forces CPU only"
    if nvcc and gpus:
        return True, f"auto: nvcc at {nvcc} and {len(gpus)} GPU(s): {gpus[0]}"
    if nvcc:
        return False, f"auto: nvcc at {nvcc} but no GPU listed by nvidia-smi -L, so CPU only"
    if gpus:
        return False, f"auto: {len(gpus)} GPU(s) but no nvcc (CUDA toolkit), so CPU only"
    return False, "auto: no CUDA toolkit and no GPU, so CPU only"


def choose(
    env: dict[str, str],
    nvcc_probe: Callable[[dict[str, str]], str | None] = find_nvcc,
    gpu_probe: Callable[[], list[str]] = list_gpus,
) -> BuildChoice:
    """Read the three switches from `env`; probe for CUDA only when SWARMKV_CUDA is auto."""
    cpu = (env.get("SWARMKV_CPU") or "native").strip().lower()
    if cpu not in CPU_MODES:
        raise ChoiceError(f"SWARMKV_CPU={env.get('SWARMKV_CPU')!r} is not one of {CPU_MODES}")
    amx = bool(parse_flag("SWARMKV_AMX", env.get("SWARMKV_AMX")))
    setting = parse_flag("SWARMKV_CUDA", env.get("SWARMKV_CUDA"), allow_auto=True)
    if setting is None:
        cuda, reason = decide_cuda(None, nvcc_probe(env), gpu_probe())
    else:
        cuda, reason = decide_cuda(setting, None, [])
    return BuildChoice(cuda=cuda, cpu=cpu, amx=amx, reason=reason)


def main() -> int:
    try:
        choice = choose(dict(os.environ))
    except ChoiceError as exc:
        print(f"build_choice: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(choice.lines())
    return 0


if __name__ == "__main__":
    sys.exit(main())
