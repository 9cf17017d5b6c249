"""The questions of `swarmkv bench --serve`'s HTTP overhead probe (serve_bench.overhead)."""

from __future__ import annotations

# The overhead probes' first words: each a different first token after the head on the default
# model (tests/model/test_serve_probe_words.py), so no probe finds an earlier one's in the
# server's cache; one per probe, the warm-up included.
PROBE_WORDS = (
    "Amber", "Basalt", "Cedar", "Dune", "Ember", "Fjord", "Granite", "Harbor", "Iris", "Juniper",
    "Kelp", "Lagoon", "Meadow", "Nectar", "Orchid", "Pebble", "Quartz", "Raven", "Saffron",
    "Tundra", "Umber", "Violet", "Willow", "Xenon", "Yarrow", "Zephyr", "Anchor", "Bramble",
    "Canyon", "Delta", "Falcon", "Glacier", "Hazel", "Indigo", "Jasper", "Lantern", "Marble",
    "Nutmeg", "Olive", "Prairie", "Quill", "Ridge", "Sparrow", "Thistle", "Upland", "Velvet",
    "Walnut", "Zinnia",
)  # fmt: skip


def probe_question(i: int) -> str:
    """The overhead probe's i-th question: a new first word each time (the server's cache
    holds earlier probes, and a shared "\n\nProbe " would spare it tokens the Swarm decodes)."""
    return f" {PROBE_WORDS[i]} is the word; what does the text say next?"
