"""Lockstep validation against vLLM's real block managers (loaded on demand; imports torch only then)."""
