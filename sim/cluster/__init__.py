"""Beyond one engine: prefill/decode disaggregation over a KV-transfer link.

* `links`: the link catalog (`sim/data/links.yaml`, with sources) and the transfer time;
* `config`: the scenario's `cluster:` section (co-located by default, or disaggregated);
* `pd_connector`: vLLM 0.11.0's NIXL P/D flow on the KV-connector seam (`sim.kv_connector`);
* `disagg`: the two pools in one SimPy environment; `run`: resolve, run, build the tables;
* `compare`: co-located vs disaggregated rows; `capacity`: GPUs needed per mode at a rate;
* `cli`: `kvsim disagg` and `kvsim cluster-capacity`.
"""
