"""Pieces shared by both kinds: the group/version, the camelCase model base, conditions, references."""

from __future__ import annotations

import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonDict

GROUP = "moelora.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# Kubernetes names: DNS-1123 labels (Services, pods) and subdomains (most objects).
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
QUANTITY = r"^[0-9]+(\.[0-9]+)?([KMGTPE]i?|[mkMGTPE]|e[0-9]+)?$"
# A `model` name clients send (the base model's or an adapter's); vLLM routes by it.
SERVED_NAME = r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$"


class ApiModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are ignored (the API server prunes them)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def to_wire(self) -> dict[str, Any]:
        """The object as the Kubernetes API sees it: camelCase keys, unset optionals left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


ConditionStatus = Literal["True", "False", "Unknown"]

# A list of conditions is a map keyed by type, so server-side apply merges each condition instead of the whole list.
CONDITIONS_LIST_MAP: JsonDict = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}


class Condition(ApiModel):
    """One observation of the object's state, in the shape of metav1.Condition."""

    type: str = Field(description="Ready, Progressing, Degraded (ModelServer); Ready, Failed (LoRAAdapter).")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase word a program can match on; see the README's troubleshooting.")
    message: str = Field(default="", description="What happened, for a person.")
    last_transition_time: datetime.datetime | None = Field(default=None, description="When status last changed.")
    observed_generation: int | None = Field(default=None, description="The spec generation this was judged on.")


class SecretRef(ApiModel):
    """A Secret in the object's own namespace holding S3 credentials.

    Keys read: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and optionally AWS_SESSION_TOKEN.
    """

    name: str = Field(pattern=DNS_SUBDOMAIN, max_length=253, description="The Secret's name.")


def set_condition(conditions: list[Condition], new: Condition, *, now: datetime.datetime) -> list[Condition]:
    """Return conditions with `new` in place of its type; keep lastTransitionTime if the status did not change."""
    result: list[Condition] = []
    replaced = False
    for old in conditions:
        if old.type != new.type:
            result.append(old)
            continue
        replaced = True
        changed = old.status != new.status
        when = now if changed or old.last_transition_time is None else old.last_transition_time
        result.append(new.model_copy(update={"last_transition_time": when}))
    if not replaced:
        result.append(new.model_copy(update={"last_transition_time": now}))
    return result
