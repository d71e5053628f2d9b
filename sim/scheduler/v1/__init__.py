"""vLLM V1's scheduler (`vllm/v1/core/sched/scheduler.py`), its release-dependent rules
(`release`) and the PRIORITY-tie mirror (`priority_ties`)."""
