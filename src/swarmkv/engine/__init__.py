"""The one decode loop: sequences, scheduling policies, `Engine.step()` (schedule, one
llama_decode, postprocess), decode statistics, snapshot creation (a prefill), and the
validation of a branch's options. Fork pipelines and the swarm both run on it.
"""
