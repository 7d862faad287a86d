"""Placement: each adapter on a few of its server's replicas instead of all of them (opt-in per ModelServer)."""

from __future__ import annotations

import enum

from pydantic import Field

from moelora.api.common import ApiModel


class CopiesMode(str, enum.Enum):
    """Fixed: `copies` per adapter. Auto: from each adapter's observed load, at least `copies`."""

    FIXED = "Fixed"
    AUTO = "Auto"


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
        description="Replicas holding each adapter whose own spec.replicas is unset; at most the server's replicas. "
        "With copiesMode Auto, the fewest.",
    )
    copies_mode: CopiesMode = Field(
        default=CopiesMode.FIXED,
        description="Auto: an adapter's copies follow its share of the server's load, as the agents observe it in "
        "vLLM's vllm:lora_requests_info (status.replicas.<pod>.load, and status.onDemandLoad for pods serving "
        "it on demand): ceil(share x replicas x lora.maxCpuLoras), "
        "within [copies, replicas]; a copy goes only once the adapter would need fewer even with half again its "
        "load. Its homes follow the same load: a pod carrying 1.5x a home's load for it (assigned or on demand) "
        "takes that copy, after any move in progress has drained. An adapter's own spec.replicas still wins.",
    )
    adapters_per_cpu_lora: int = Field(
        default=4,
        ge=1,
        le=100,
        description="A replica holds at most this many times lora.maxCpuLoras (vLLM's default: maxLoras) "
        "adapters, as well as at most its disk budget: past its CPU slots, a request may wait for its adapter to be "
        "read from disk. Copies no replica has room for are reported in status.placement.short and in the "
        "server's Degraded condition (reason PlacementShort).",
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
    short: int = Field(default=0, ge=0, le=1000, description="Copies wanted that no pod had room for (disk or count).")
    copies: int | None = Field(
        default=None, ge=1, le=1000, description="Copies the operator wants for it (its target, unless short)."
    )
    load: float | None = Field(
        default=None,
        ge=0,
        le=1e6,
        description="With copiesMode Auto: its requests in flight, summed over the pods' reports, that the copies "
        "were judged on.",
    )
