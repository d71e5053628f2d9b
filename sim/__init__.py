"""kvsim: a discrete-event simulator of an LLM-serving engine's scheduler and paged KV cache.

`import sim` never imports torch; kernel timing lives in the separate `calibrate` package.
"""

__version__ = "0.1.0"
