"""Building the algorithm: RLlib's obscure failure when no env runner started, made clear."""

from __future__ import annotations

import pytest

from training.run.driver import EnvRunnersDidNotStart, _build_algo


class _FailingConfig:
    """Stands in for an AlgorithmConfig whose build fails with `exc`."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def build_algo(self) -> None:
        def get_spaces() -> None:  # named like RLlib's EnvRunnerGroup.get_spaces
            raise self.exc

        get_spaces()


def test_no_env_runner_started_is_reported_with_the_count_and_what_to_check() -> None:
    with pytest.raises(EnvRunnersDidNotStart, match=r"none of the 2 env runner\(s\) started"):
        _build_algo(_FailingConfig(IndexError("list index out of range")), 2)


def test_other_build_failures_pass_through_unchanged() -> None:
    with pytest.raises(ValueError, match="bad hyperparameter"):
        _build_algo(_FailingConfig(ValueError("bad hyperparameter")), 2)
