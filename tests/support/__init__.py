"""Helpers shared by every test tier, importable as `support` (pytest's `pythonpath`).

| module        | what it holds                                                        |
|---------------|----------------------------------------------------------------------|
| decoding      | the one chunked-prefill loop and greedy continuation for tests       |
| memory        | resident-memory readers (after a collection and a malloc trim)       |
| proc          | starting Python subprocesses on the installed package                |
| realmodel     | text cut from the pinned tree for the real-model tier                |
| samples       | sample records (a provenance block) for report tests                 |
| scale         | loop sizes scaled by SWARMKV_TEST_SCALE                              |
| tiers         | every collected test, kept for the check that the tiers cover them   |
| tinymodel     | tiny random-weight GGUF models generated with gguf                   |
"""
