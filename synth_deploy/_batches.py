"""`take_batch`: what a worker thread drains from its queue to handle in one go."""

from __future__ import annotations

import queue
from typing import Any


def take_batch(source: queue.Queue[Any], first: Any, limit: int,
               stop: object) -> tuple[list[Any], bool]:
    """``first`` and whatever ``source`` holds right now, up to ``limit`` items in all (a
    batch is one commit or one send, not one per item). The flag says the ``stop`` marker
    came among them: it is left out, and nothing queued after it is taken."""
    batch = [first]
    while len(batch) < limit:
        try:
            item = source.get_nowait()
        except queue.Empty:
            break
        if item is stop:
            return batch, True
        batch.append(item)
    return batch, False
