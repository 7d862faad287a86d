"""Rendered objects of other projects' kinds, judged against those projects' published CRDs (vendored in
moelora.local.apiserver's upstream_crds/, loaded as published): the OpenAPI schema, every CEL rule, and pruning."""

from __future__ import annotations

from typing import Any

from moelora.local.apiserver import upstream


def problems(obj: dict[str, Any], *, file: str | None = None) -> list[str]:
    """Why a server with the published CRD (its kind's newest vendored release, or `file`) would refuse `obj`, each
    error in the server's words, and which fields it would silently drop; [] when it stores `obj` as rendered."""
    admission = upstream.admission(obj, file=file)
    return [str(error) for error in admission.errors] + [
        f"{path}: pruned (not in the schema)" for path in admission.pruned
    ]


def stored(obj: dict[str, Any], *, file: str | None = None) -> dict[str, Any]:
    """`obj` as the server stores it (defaults filled); fails when it would be refused or pruned."""
    found = problems(obj, file=file)
    assert found == [], found
    return upstream.admission(obj, file=file).stored
