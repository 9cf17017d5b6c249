"""Handoff modes: how a branch gets the document's KV state (see base.py for the interface).

| mode     | module      | the document's KV state reaches a branch by                      |
|----------|-------------|------------------------------------------------------------------|
| host     | host.py     | export once to a pool buffer, copy per branch, restore           |
| fork     | fork.py     | llama_memory_seq_cp inside one context (zero copy), batched      |
| device   | device.py   | ON_DEVICE state copy inside one context (never via host), batched |
| baseline | baseline.py | no sharing: every branch prefills the whole document itself      |
"""

from __future__ import annotations

from ...errors import ConfigError
from ..modes import MODES, ForkOptions
from .base import Handoff, Plan, result_of
from .baseline import BaselineHandoff
from .device import DeviceHandoff
from .fork import ForkHandoff
from .host import HostHandoff

__all__ = [
    "MODES",
    "BaselineHandoff",
    "DeviceHandoff",
    "ForkHandoff",
    "ForkOptions",
    "Handoff",
    "HostHandoff",
    "Plan",
    "make_handoff",
    "result_of",
]


def make_handoff(mode: str, fork: ForkOptions) -> Handoff:
    """The Handoff for a mode name; ConfigError naming the choices for an unknown one."""
    if mode == "host":
        return HostHandoff()
    if mode == "fork":
        return ForkHandoff(fork)
    if mode == "device":
        return DeviceHandoff(fork)
    if mode == "baseline":
        return BaselineHandoff()
    raise ConfigError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
