"""Peak Python heap per block object while a block pool is built (`sim.memory.host`).

    python benchmarks/block_object_bytes.py [NUM_BLOCKS]     # default 200,000

Prints, per design and prefix caching on/off, the peak bytes per GPU block and per CPU block
(tracemalloc). `sim.memory.host.BYTES_PER_BLOCK` holds the largest of these, rounded up.
"""

from __future__ import annotations

import sys

from sim.kv.config import Design
from sim.memory.host import peak_bytes_per_block


def main() -> None:
    num_blocks = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    for design in Design:
        for prefix_caching in (False, True):
            gpu = peak_bytes_per_block(design, num_blocks, prefix_caching)
            cpu = peak_bytes_per_block(design, num_blocks, prefix_caching, cpu=True)
            print(f"{design.value:10} prefix_caching={prefix_caching!s:5}  GPU {gpu:6.1f} B/block"
                  f"  CPU {cpu:6.1f} B/block")  # fmt: skip


if __name__ == "__main__":
    main()
