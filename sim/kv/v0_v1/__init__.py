"""vLLM v0 BlockSpaceManagerV1 (0.5.4 `vllm/core/block_manager_v1.py`): the manager (`manager`),
its physical block allocators (`alloc`), evictor (`evictor`), prefix hashing (`hashing`) and
read-only queries (`queries`)."""
