"""vLLM v0's scheduler (0.5.4 `vllm/core/scheduler.py`)."""
