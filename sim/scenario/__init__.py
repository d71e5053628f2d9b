"""A scenario: the YAML schema (`schema`), `--set` overrides (`overrides`), strict field types
(`fields`), and its resolution into the configs the engine runs (`resolve`), with the startup
checks vLLM itself makes (`startup`) and the settings that would have no effect (`no_effect`)."""
