"""Prometheus metrics (prometheus-client), one registry per app: request counts by status and
latency histograms observed by the handlers, and gauges read from the runtime at each scrape."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class _RuntimeCollector(Collector):
    """Queue depth, live branches, KV cells and prompt tokens, read at scrape time."""

    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self.status = status

    def collect(self) -> Iterator[Any]:
        s = self.status()
        yield GaugeMetricFamily("swarmkv_queue_depth", "Requests waiting", value=s["queued"])
        yield GaugeMetricFamily("swarmkv_live_branches", "Requests decoding", value=s["live"])
        yield GaugeMetricFamily("swarmkv_kv_cells_used", "KV cells in use", value=s["cells_used"])
        yield GaugeMetricFamily(
            "swarmkv_kv_cells_shared",
            "KV cells read by more than one sequence",
            value=s["cells_shared"],
        )
        yield GaugeMetricFamily("swarmkv_kv_cells_total", "KV cells (n_ctx)", value=s["n_ctx"])
        prompt = CounterMetricFamily(
            "swarmkv_prompt_tokens",
            "Prompt tokens, computed or reused from the prefix cache",
            labels=["kind"],
        )
        prompt.add_metric(["computed"], s["prompt_tokens_computed"])
        prompt.add_metric(["reused"], s["prompt_tokens_reused"])
        yield prompt
        yield CounterMetricFamily(
            "swarmkv_tokenizer_tokens_reused",
            "Text prompts' tokens taken from a recent prompt's instead of tokenized again",
            value=s["tokenizer_tokens_reused"],
        )


class Metrics:
    """The app's registry and the handlers' instruments."""

    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "swarmkv_requests",
            "HTTP requests by endpoint and status",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "swarmkv_time_to_first_token_seconds",
            "Arrival to first generated token",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            "swarmkv_inter_token_seconds",
            "Gap between consecutive generated tokens",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_RuntimeCollector(status))

    def observe(self, ttft_ms: float | None, gaps_ms: tuple[float, ...]) -> None:
        if ttft_ms is not None:
            self.ttft.observe(ttft_ms / 1e3)
        for gap in gaps_ms:
            self.itl.observe(gap / 1e3)

    def render(self) -> bytes:
        return generate_latest(self.registry)
