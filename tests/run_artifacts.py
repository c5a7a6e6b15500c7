"""What a training run left, read as a user's tools read it: its learners' losses as
TensorBoard does, and its checkpoints' weights as `uerl eval` fingerprints them."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from training.run.checkpoints import load_modules
from training.run.evaluation import weights_fingerprint


def fingerprints(checkpoint: Path) -> dict[str, str]:
    """Each policy's weights' fingerprint in `checkpoint`."""
    return weights_fingerprint(load_modules(checkpoint).get_state(inference_only=True))


def learner_losses(run_dir: Path) -> dict[str, list[float]]:
    """Every `learner/<policy>/...loss` scalar TensorBoard reads from the run."""
    out: dict[str, list[float]] = {}
    for events in sorted(run_dir.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            if tag.startswith("learner/") and tag.endswith("loss"):
                out.setdefault(tag, []).extend(e.value for e in acc.Scalars(tag))
    return out
