"""kvsim's corrected v0 design: BlockSpaceManagerV2 with admission and allocation in agreement."""
