"""Harnesses shared by the tests: named drivers and snapshots, imported by the test modules."""
