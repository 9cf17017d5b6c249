"""KV state outside a context: snapshots in host buffers (capture, restore, fork), the `.swkv`
file format, and prefix sources (a snapshot file a document may start from).
"""
