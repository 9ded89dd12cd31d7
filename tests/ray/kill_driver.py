"""A ``fastload`` CLI run whose Ray tasks each sleep ``DELAY_S`` before writing, so that a test can kill this
driver mid-run::

    python kill_driver.py DELAY_S pack SRC DST --engine ray --ray-address ADDR ...
"""

from __future__ import annotations

import sys

from fastload import cli
from fastload.packing import ray_engine as rayengine

if __name__ == "__main__":
    rayengine._test_fault = rayengine._Fault(delay_s=float(sys.argv[1]))
    sys.exit(cli.main(sys.argv[2:]))
