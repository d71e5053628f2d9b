"""The hostile-input suite: a table of (input, command, expected exit, message fragment).

See `harness.py` for the case format and `test_hostile.py` for how each case is run.
"""
