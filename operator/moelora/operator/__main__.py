"""`python3 -m moelora.operator`: run the operator with settings from the environment (see settings.py)."""

from __future__ import annotations

import asyncio
import logging
import sys

from moelora.operator.control.wiring import run
from moelora.operator.settings import Settings


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        print(f"moelora-operator: {exc}", file=sys.stderr)
        return 2
    asyncio.run(run(settings=settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
