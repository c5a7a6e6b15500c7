"""What `uerl bench`, its end-to-end part and `uerl bench-runner` measure with.

The CPU time of a process (the client, a mock game) and RLlib's own single-agent PPO,
the baseline of every ratio. It imports none of the bench modules: they import it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def process_cpu_s(pid: int | None = None) -> float | None:
    """User + system CPU seconds of a process (all threads); this one if pid is None."""
    if pid is None:
        return time.process_time()
    try:  # Linux; fields 14 and 15 after the parenthesised command name
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def game_cpu_s(pid: int) -> float:
    """A mock game's CPU seconds; RuntimeError if it has exited."""
    cpu = process_cpu_s(pid)
    if cpu is None:
        raise RuntimeError(f"mock game (pid {pid}) exited during the bench")
    return cpu


def single_agent_config(uerl_config: Any, env_id: str) -> Any:
    """uerl's PPO config (same runners, environments per runner, hyperparameters, seed)
    as RLlib's ordinary single-agent PPO on the gymnasium environment `env_id`."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
    from ray.rllib.policy.sample_batch import DEFAULT_POLICY_ID

    config = uerl_config.copy(copy_frozen=False)
    config.environment(
        env=env_id, observation_space=None, action_space=None, disable_env_checking=False
    )
    config.env_config = {}  # `environment(env_config=...)` merges into uerl's; replace it
    config.env_runners(env_runner_cls=SingleAgentEnvRunner)
    config.multi_agent(
        policies={DEFAULT_POLICY_ID},
        policy_mapping_fn=lambda *_args, **_kwargs: DEFAULT_POLICY_ID,
        policies_to_train=None,
    )
    config.rl_module(rl_module_spec=RLModuleSpec())
    return config
