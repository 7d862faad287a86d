"""The agent's settings: its container's environment, parsed by the contract the operator renders it from
(moelora.api.agent_env, where every variable's name, type and default lives)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from moelora.api.agent_env import AgentEnv as Settings
from moelora.api.agent_env import AgentEnvError as SettingsError

__all__ = ["Settings", "SettingsError", "from_env"]


def from_env(env: Mapping[str, str] | None = None) -> Settings:
    """Settings from `env` (default: os.environ); SettingsError names each bad or missing variable."""
    return Settings.parse(os.environ if env is None else env)
