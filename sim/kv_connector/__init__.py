"""KV connectors for the V1 engine: the scheduler-side seam (`base`, `hooks`) and CPU offloading."""
