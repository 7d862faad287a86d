"""spec.routing: how a gateway reaches a ModelServer through the Gateway API Inference Extension."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from moelora.api.common import DNS_LABEL, DNS_SUBDOMAIN, ApiModel

# The endpoint picker's gRPC port in the extension's manifests and chart (ext-proc).
EPP_PORT = 9002


class ParentRef(ApiModel):
    """A Gateway the server's HTTPRoute attaches to."""

    name: str = Field(pattern=DNS_SUBDOMAIN, max_length=253, description="The Gateway's name.")
    namespace: str | None = Field(
        default=None,
        pattern=DNS_LABEL,
        max_length=63,
        description="The Gateway's namespace. Default: the ModelServer's (another needs the Gateway to allow it).",
    )
    section_name: str | None = Field(
        default=None, pattern=DNS_LABEL, max_length=253, description="One listener of the Gateway, by name."
    )


class EndpointPickerRef(ApiModel):
    """The endpoint picker (EPP) the gateway asks which pod serves each request: one the user runs for this pool."""

    service_name: str | None = Field(
        default=None,
        pattern=DNS_LABEL,
        max_length=63,
        description="Its Service in the ModelServer's namespace. Default: <ModelServer name>-epp, the name the "
        "extension's inferencepool chart gives it for a pool of the ModelServer's name.",
    )
    port: int = Field(default=EPP_PORT, ge=1, le=65535, description="Its gRPC (ext-proc) Service port.")
    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        default="FailClose",
        description="FailOpen: the gateway picks a pod itself while the picker is down. FailClose: it refuses.",
    )


class GatewayRouting(ApiModel):
    """An InferencePool of the server's pods and an HTTPRoute matching its model names, for an inference gateway."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!self.enabled || (has(self.parentRefs) && size(self.parentRefs) > 0)",
                    "message": "parentRefs names at least one Gateway when enabled",
                    "fieldPath": ".parentRefs",
                }
            ]
        }
    )

    enabled: bool = Field(default=False, description="Render the InferencePool and the HTTPRoute.")
    parent_refs: list[ParentRef] = Field(
        default_factory=list, max_length=8, description="The Gateways the HTTPRoute attaches to."
    )
    endpoint_picker: EndpointPickerRef = Field(default_factory=EndpointPickerRef, json_schema_extra={"default": {}})
    route_to_home: bool = Field(
        default=False,
        description="Needs spec.placement. Each adapter is placed on one pod, its home, or on every pod when the "
        "copies rule (placement.copies, or copiesMode Auto's) gives it the server's replicas; an adapter's own "
        "spec.replicas still wins. Requests for an adapter placed on one pod alone go straight to that pod "
        "(a Service per pod, <name>-home-<ordinal>) once it is loaded there and the pod is ready; every other "
        "adapter, and one moving or whose home is not ready, goes through the InferencePool and its endpoint "
        "picker, where any pod serves it (loading it on demand).",
    )


class RoutingSpec(ApiModel):
    """Routing besides the plain Service (which always stays)."""

    gateway: GatewayRouting = Field(default_factory=GatewayRouting, json_schema_extra={"default": {}})
