"""Beyond one engine: prefill/decode disaggregation over a KV-transfer link.

`links` (the link catalog and transfer time), `config` (the scenario's `cluster:` section).
"""
