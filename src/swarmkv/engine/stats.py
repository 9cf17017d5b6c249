"""Where decode time goes, summed over a run: the engine's step counters."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class DecodeStats:
    """Where decode time goes, summed over a run (nanoseconds). Python overhead of a
    generation step is everything in the step but llama_decode: batch filling, sampling,
    stop checks, callbacks."""

    prompt_ns: int = 0
    prompt_decodes: int = 0
    gen_steps: int = 0
    gen_step_ns: int = 0
    gen_decode_ns: int = 0
    capture_ns: int = 0  # copying logits for fidelity checks (keep_logits): not the product's
    # host mode may decode several branch contexts at once (max_contexts > 1)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add_prompts(self, ns: int, decodes: int) -> None:
        """Add prompt decodes' time (nanoseconds) and count; thread-safe."""
        with self._lock:
            self.prompt_ns += ns
            self.prompt_decodes += decodes

    def add_step(self, step_ns: int, decode_ns: int, capture_ns: int) -> None:
        """Count one generation step and add its total, decode and capture times (ns)."""
        with self._lock:
            self.gen_steps += 1
            self.gen_decode_ns += decode_ns
            self.capture_ns += capture_ns
            self.gen_step_ns += step_ns

    def to_ms(self) -> dict[str, float]:
        """The totals in milliseconds, plus step count, time per step and Python overhead %."""
        step = self.gen_step_ns or 1
        return {
            "prompt_ms": self.prompt_ns / 1e6,
            "gen_steps": float(self.gen_steps),
            "gen_ms": self.gen_step_ns / 1e6,
            "gen_decode_ms": self.gen_decode_ns / 1e6,
            "gen_ms_per_step": self.gen_step_ns / 1e6 / max(self.gen_steps, 1),
            "python_overhead_pct": 100.0 * (self.gen_step_ns - self.gen_decode_ns) / step,
            "logit_capture_ms": self.capture_ns / 1e6,
        }
