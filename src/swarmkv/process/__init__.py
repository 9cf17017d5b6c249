"""Process plumbing with no native code: worker threads that are always joined, and Ctrl-C
handling (a flag that never raises inside native code).
"""
