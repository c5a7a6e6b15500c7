"""Building the algorithm: one more try when no env runner started, no retry otherwise."""

from __future__ import annotations

import pytest

from training.driver import _build_algo


class _FlakyConfig:
    """Stands in for an AlgorithmConfig whose first build finds no env runner."""

    def __init__(self, failures: list[BaseException]) -> None:
        self.failures = failures
        self.builds = 0

    def build_algo(self) -> str:
        self.builds += 1
        if self.failures:
            self._raise(self.failures.pop(0))
        return "algo"

    @staticmethod
    def _raise(exc: BaseException) -> None:
        def get_spaces() -> None:  # named like RLlib's EnvRunnerGroup.get_spaces
            raise exc

        get_spaces()


def test_build_is_retried_once_when_no_env_runner_started() -> None:
    config = _FlakyConfig([IndexError("list index out of range")])
    logged: list[str] = []
    assert _build_algo(config, logged.append) == "algo"
    assert config.builds == 2
    assert "no env runner started" in logged[0]


def test_other_build_failures_are_not_retried() -> None:
    config = _FlakyConfig([ValueError("bad hyperparameter")])
    with pytest.raises(ValueError, match="bad hyperparameter"):
        _build_algo(config, print)
    assert config.builds == 1


def test_a_second_failure_is_raised() -> None:
    config = _FlakyConfig([IndexError("first"), IndexError("second")])
    with pytest.raises(IndexError, match="second"):
        _build_algo(config, print)
    assert config.builds == 2
