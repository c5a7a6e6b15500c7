"""The low-latency gRPC setting reaches env runner processes before grpc loads."""

from __future__ import annotations

import subprocess
import sys

import pytest

from training.clients.grpc_tuning import LOW_LATENCY_EXPERIMENTS


def _run(code: str, env_extra: dict[str, str] | None = None) -> str:
    import os

    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    env.update(env_extra or {})
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return out.stdout.strip()


def test_importing_the_env_runner_module_does_not_load_grpc() -> None:
    code = "import sys, training.rllib.env_runner; print('grpc' in sys.modules)"
    assert _run(code) == "False"


def test_setting_is_applied_in_a_fresh_process() -> None:
    code = (
        "import os; from training.clients.grpc_tuning import apply_low_latency_defaults as a;"
        "print(a(), os.environ['GRPC_EXPERIMENTS'])"
    )
    assert _run(code) == f"True {LOW_LATENCY_EXPERIMENTS}"


@pytest.mark.parametrize("preset", ["", "some_experiment"])
def test_an_explicit_grpc_experiments_setting_wins(preset: str) -> None:
    code = (
        "import os; from training.clients.grpc_tuning import apply_low_latency_defaults as a;"
        "print(a(), repr(os.environ['GRPC_EXPERIMENTS']))"
    )
    assert _run(code, {"GRPC_EXPERIMENTS": preset}) == f"False {preset!r}"


def test_nothing_changes_once_grpc_is_loaded() -> None:
    code = (
        "import grpc, os\n"
        "from training.clients.grpc_tuning import apply_low_latency_defaults as a\n"
        "print(a(), 'GRPC_EXPERIMENTS' in os.environ)"
    )
    assert _run(code) == "False False"
