"""`swarmkv serve`: an OpenAI-compatible server over one engine with automatic prefix reuse.

The runtime (runtime.py: the engine thread, the prefix cache) needs no web framework; the
HTTP layer (http/) is the `[serve]` extra's.
"""
