"""`python -m sim.cli ...` is the `kvsim` command."""

from sim.cli.main import main

main()
