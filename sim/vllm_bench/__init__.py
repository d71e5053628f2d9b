"""`vllm serve` in, `vllm bench serve` out.

`flags` (every `vllm serve` option of the pinned releases, by what kvsim does with it; the
options themselves in `sim/data/vllm_serve_flags/`), `serve_line` (a command line parsed as the
release's parser does), `models` (MODEL: catalog name, known Hugging Face id or local
config.json), `importer` (`kvsim import-vllm`: the line -> a scenario), `datasets` (the lengths
and shared prefixes `vllm bench serve` samples), `arrivals` (its request times), `metrics` (its
result block and JSON keys), `bench` (`kvsim bench serve`), `compare` (`kvsim compare-bench`).
"""
