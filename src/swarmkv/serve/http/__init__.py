"""The OpenAI-compatible HTTP layer (FastAPI): the only part of SwarmKV that imports FastAPI,
uvicorn or prometheus-client (the `[serve]` extra). It queues work on the runtime and reads
its results; it never touches a native handle."""
