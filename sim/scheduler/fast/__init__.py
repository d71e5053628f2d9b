"""The speed layer: shortcuts over the faithful schedulers that change no decision.

* `layer`: the decode fast path over both schedulers' running phases;
* `v0`, `v1`: each scheduler's shortcut implementation; `cohort`: decodes advanced unvisited.
"""
