"""A stand-in for what checkpoints.save calls of an RLlib algorithm, for tests of where
and how runs are stored (no Ray needed to write a checkpoint's files)."""

from __future__ import annotations

import pickle
from pathlib import Path

from training.run import checkpoints


class SavingAlgo:
    """Writes a module file like RLlib's, or fails half way (a full volume, a lost pod)
    after writing part of it; `size` bytes of weights."""

    def __init__(self, fail: bool = False, size: int = 7) -> None:
        self.fail = fail
        self.size = size

    def save_to_path(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)  # as RLlib's does
        (Path(path) / "module_state.pkl").write_bytes(pickle.dumps(b"w" * self.size))
        if self.fail:
            raise OSError(28, "No space left on device")


def meta(iteration: int) -> checkpoints.CheckpointMeta:
    return checkpoints.CheckpointMeta(iteration, iteration * 100, "PPO")
