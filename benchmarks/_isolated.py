"""Run one measurement in a forked child, so that the peak RSS of the processes it starts is
its own: `ru_maxrss` of reaped children is a maximum over every child reaped so far, so two
replays started from one process would share it. Shared by the replay benchmarks."""

from __future__ import annotations

import json
import os
import resource
from collections.abc import Callable


def in_forked_child(run: Callable[[], dict]) -> dict:
    """`run()`'s row (JSON-able) from a forked child, with `peak_rss_mb` of its children."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        row = run()
        row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        os.write(write, json.dumps(row).encode())
        os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 65536):
        data += chunk
    os.waitpid(pid, 0)
    return json.loads(data)
