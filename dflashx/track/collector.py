"""How a long `dflashx` process runs Python's cyclic garbage collector.

A process that runs stages imports torch, transformers, DeepSpeed, datasets and matplotlib: millions of container
objects that live as long as the process. With CPython's default young-generation threshold (700 net
allocations) those imports set off hundreds of young collections and ~8 full passes over the growing heap, and
free next to nothing. At `YOUNG_THRESHOLD` they set off none (`benchmarks/collector.py`: those imports took 4.2 s
of CPU against 5.0 s on the 2 development cores, interleaved repeats). Cycles are still collected, every
`YOUNG_THRESHOLD` allocations instead of 700; where memory matters the stages collect explicitly (the eval stage
and the round trip before a server starts).
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000


def for_long_process() -> None:
    """Raise the young generation's threshold to YOUNG_THRESHOLD, the older generations' as they are."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
