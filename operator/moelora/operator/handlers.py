"""The import path moelora.local's OperatorThread still uses for `run`; the handlers live in model_servers.py and
lora_adapters.py, the wiring in wiring.py. Remove once moelora.local imports moelora.operator.wiring."""

from __future__ import annotations

from moelora.operator.wiring import run

__all__ = ["run"]
