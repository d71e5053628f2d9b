"""What a run reports: the columnar step and request records (`records`), the summary statistics
(`stats`), the tables and summary as a `RunResult` (`results`), session metrics (`sessions`),
and what `kvsim run` prints (`terminal`)."""
