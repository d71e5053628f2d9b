"""The `kvsim` command line: `main` builds the app; one module per command group.

* `main`: `kvsim run`, `kvsim disagg`-free core commands and the app itself (`main()`, the entry point);
* `exits`: how every command maps bad input to exit 2 and an internal error to a traceback;
* `step`, `calibrate`, `plot`: `kvsim step`, `kvsim calibrate`, `kvsim plot`;
* `planning`, `versions`: `kvsim sweep` / `kvsim capacity`, `kvsim compare-versions`;
* `cluster`: `kvsim disagg`, `kvsim cluster-capacity`; `ci`: `kvsim check`, `fuzz`, `shrink`;
* `verify`: `kvsim verify` against vLLM's real code;
* `bench`: `kvsim import-vllm`, `kvsim bench serve`, `kvsim compare-bench`.
"""
