"""Two ``fastload.serve`` loaders in a process where Ray was not running: the first starts it, both use it;
closing one leaves it up for the other, and collecting the other shuts it down::

    python serve_own_ray.py ROOT
"""

from __future__ import annotations

import gc
import sys

import ray

import fastload

if __name__ == "__main__":
    first = fastload.serve(sys.argv[1], 4, feeders=1, feeder_cpus=0.5, seed=3)
    with first:
        next(iter(first))
        second = fastload.serve(sys.argv[1], 4, feeders=1, feeder_cpus=0.5, seed=3)
        next(iter(second))
    print("after close:", ray.is_initialized())
    del second
    gc.collect()
    print("after collect:", ray.is_initialized())
