"""Placement: each adapter on a few of its server's replicas instead of all of them (opt-in per ModelServer)."""

from __future__ import annotations

from pydantic import Field

from moelora.api.common import ApiModel


class PlacementSpec(ApiModel):
    """Serve each adapter on `copies` replicas chosen by rendezvous hashing over the pods' stable names.

    Setting it renders the server as a StatefulSet (pods `<name>-0 .. <name>-N-1`), so a pod keeps its adapters
    across restarts and scaling moves only the adapters the new or removed pod gains or loses. Each replica's disk
    budget is `adapterCache.sizeLimit`. Without a gateway that routes by adapter (the Gateway API Inference
    Extension), clients must send each request to a pod listed in the adapter's `status.placement.replicas`.
    """

    copies: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="Replicas holding each adapter whose own spec.replicas is unset; at most the server's replicas.",
    )
    drain_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="How long a moved adapter stays on its old replica once every new one has loaded it: time for "
        "clients and routers reading status.placement to switch, and for requests under way there to finish.",
    )


class AdapterPlacement(ApiModel):
    """Where the operator assigned an adapter; the agents of the pods listed in `replicas` serve it."""

    replicas: list[str] = Field(
        default_factory=list,
        description="Pods that serve the adapter now: its target pods plus, during a move, the old ones (draining).",
    )
    target: list[str] = Field(default_factory=list, description="Where placement puts it, best-ranked first.")
    draining: list[str] = Field(
        default_factory=list,
        description="Old pods kept until every target pod reports it loaded (make-before-break).",
    )
    short: int = Field(default=0, ge=0, description="Copies wanted that no pod had disk room for.")
