"""Which of vLLM's processes run the plugin, as data (touchpoints.py says how each kind is checked): the OpenAI
server's engine is spawned and loads the plugins itself, so the server's own process only registers the resolver
(front_end_only in __init__.py). Stdlib only, like contract.py.
"""

from __future__ import annotations

from .contract import Touchpoint

__all__ = ["PROCESSES"]

PROCESSES: tuple[Touchpoint, ...] = (
    Touchpoint(
        "server entry points choose spawn",
        "text",
        ("entrypoints/serve/utils/api_utils.py", "entrypoints/common/startup.py"),
        "the OpenAI server's engine process spawned unless the environment says otherwise",
        (
            'if "VLLM_WORKER_MULTIPROC_METHOD" not in os.environ:',
            'os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"',
        ),
        "register (front_end_only)",
    ),
    Touchpoint(
        "engine core loads the plugins",
        "text",
        ("v1/engine/core.py",),
        "a spawned engine core runs the general plugins itself",
        ("load_general_plugins()",),
        "register (front_end_only)",
    ),
)
