"""The thin owners of native handles: model, context and its configuration, batch, sampler,
host buffer pool, and the context sizing (budget, KV-byte estimates) that context creation
checks. Each owner frees its handle once. Imports only `_native`, `process` and `errors`.
"""
