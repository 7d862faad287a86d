"""Errors shared by the operator's builders and handlers."""

from __future__ import annotations

import pydantic


class SpecProblem(Exception):
    """Something in a spec the schema accepted but only the operator can judge. Becomes a condition and an Event."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def problem_from_validation(error: pydantic.ValidationError) -> SpecProblem:
    """An InvalidSpec problem naming the first field the models refused."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return SpecProblem("InvalidSpec", f"spec.{where}: {first['msg']}")
