"""A training loop fed by ``fastload.serve`` that checkpoints after every step (the data position and the
keys trained on, in one file written atomically), so that a test can SIGKILL it mid-epoch::

    python serve_trainer.py ROOT RAY_ADDRESS CHECKPOINT
"""

from __future__ import annotations

import os
import sys
import time

import torch

import fastload

if __name__ == "__main__":
    root, address, checkpoint = sys.argv[1:4]
    options = {"seed": 3, "shuffle_buffer": 8}
    loader = fastload.serve(root, 4, feeders=2, feeder_cpus=0.5, ray_address=address, **options)
    seen: list[str] = []
    for batch in loader:
        time.sleep(0.3)  # the step
        seen += batch["__key__"]
        torch.save({"data": loader.state_dict(), "seen": seen}, checkpoint + ".tmp")
        os.replace(checkpoint + ".tmp", checkpoint)
    print("finished")
