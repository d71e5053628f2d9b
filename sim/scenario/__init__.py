"""A scenario: the YAML schema (`schema`, its sections `sections`), `--set` overrides (`overrides`), strict field types
(`fields`), and its resolution into the configs the engine runs (`resolve`; the one translation
into `SchedulerConfig` / `KVCacheConfig` / memory inputs is `configs`; the KV pool's size and
groups `kv_pool`), with the startup checks vLLM itself makes (`startup`), the settings that would have no effect (`no_effect`), and each
pinned release's own launch defaults (`vllm_defaults`)."""
