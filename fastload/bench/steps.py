"""The training step the consumer runs after each batch: a fixed time (sleep: the CPU is free, as while a GPU
computes; busy: a core is busy, as in CPU training) or a small real torch model (forward, backward, SGD)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def sleep_step(step_s: float) -> Callable[[dict[str, Any]], None]:
    def step(batch: dict[str, Any]) -> None:
        time.sleep(step_s)

    return step


def busy_step(step_s: float) -> Callable[[dict[str, Any]], None]:
    def step(batch: dict[str, Any]) -> None:
        end = time.perf_counter() + step_s
        while time.perf_counter() < end:
            pass

    return step


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def model_step(device: str, classes: int = 10) -> Callable[[dict[str, Any]], None]:
    """A small CNN trained on the batch: copy to ``device`` (pinned, non-blocking on CUDA), forward,
    cross-entropy, backward, SGD; synchronised so the step's time is the real compute time."""
    import torch
    from torch import nn

    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, classes),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    cuda = device.startswith("cuda")

    def step(batch: dict[str, Any]) -> None:
        images, labels = batch["image"], batch["label"]
        if cuda:
            images, labels = images.pin_memory(), labels.pin_memory()
        x = images.to(device, non_blocking=cuda).float().div_(255)
        y = labels.to(device, non_blocking=cuda).clamp_(0, classes - 1)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()

    return step
