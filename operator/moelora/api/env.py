"""Environment of the vLLM container: literal values, or references the kubelet resolves (Secrets, ConfigMaps,
the downward API), so credentials never sit in the ModelServer itself."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from moelora.api.common import DNS_SUBDOMAIN, QUANTITY, ApiModel

ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# A ConfigMap or Secret key: what Kubernetes accepts as a data key.
DATA_KEY = r"^[-._a-zA-Z0-9]+$"


def _exactly_one(*fields: str, message: str) -> ConfigDict:
    present = ", ".join(f"has(self.{field})" for field in fields)
    return ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [{"rule": f"[{present}].filter(x, x).size() == 1", "message": message}]
        }
    )


class KeySelector(ApiModel):
    """One key of a Secret or ConfigMap in the ModelServer's namespace."""

    name: str = Field(pattern=DNS_SUBDOMAIN, max_length=253, description="The object's name.")
    key: str = Field(pattern=DATA_KEY, max_length=253, description="The key whose value the variable takes.")
    optional: bool | None = Field(
        default=None, description="Start the container even if the object or key is missing. Default: false."
    )


class FieldSelector(ApiModel):
    """A field of the pod (the downward API), e.g. metadata.name or status.podIP."""

    field_path: str = Field(
        min_length=1, max_length=128, description="The field, e.g. metadata.name, spec.nodeName, status.podIP."
    )
    api_version: str | None = Field(
        default=None, max_length=16, description="Version of fieldPath's schema. Default: v1."
    )


class ResourceFieldSelector(ApiModel):
    """A resource request or limit of a container, e.g. limits.memory."""

    resource: str = Field(min_length=1, max_length=64, description="The resource, e.g. limits.cpu or requests.memory.")
    container_name: str | None = Field(default=None, max_length=63, description="The container. Default: vllm.")
    divisor: str | None = Field(
        default=None, pattern=QUANTITY, max_length=32, description="Unit of the value, e.g. 1Mi."
    )


class EnvVarSource(ApiModel):
    """Where a variable's value comes from: exactly one of the four."""

    model_config = _exactly_one(
        "secretKeyRef",
        "configMapKeyRef",
        "fieldRef",
        "resourceFieldRef",
        message="valueFrom needs exactly one of secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef",
    )

    secret_key_ref: KeySelector | None = Field(default=None, description="A key of a Secret, e.g. an API token.")
    config_map_key_ref: KeySelector | None = Field(default=None, description="A key of a ConfigMap.")
    field_ref: FieldSelector | None = Field(default=None, description="A field of the pod (downward API).")
    resource_field_ref: ResourceFieldSelector | None = Field(
        default=None, description="A resource request or limit of a container."
    )


class EnvVar(ApiModel):
    """One environment variable of the vLLM container: a literal value or a reference, exactly one of them."""

    model_config = _exactly_one("value", "valueFrom", message="set exactly one of value and valueFrom")

    name: str = Field(pattern=ENV_NAME, max_length=128, description="The variable's name.")
    value: str | None = Field(
        default=None, max_length=512, description="A literal value (never a credential: use valueFrom)."
    )
    value_from: EnvVarSource | None = Field(default=None, description="Where the value comes from.")


class ObjectRef(ApiModel):
    """A Secret or ConfigMap whose every key becomes a variable."""

    name: str = Field(pattern=DNS_SUBDOMAIN, max_length=253, description="The object's name.")
    optional: bool | None = Field(default=None, description="Start the container even if it is missing.")


class EnvFromSource(ApiModel):
    """All keys of one Secret or ConfigMap as variables; variables in env, and moelora's own, take precedence."""

    model_config = _exactly_one("secretRef", "configMapRef", message="set exactly one of secretRef and configMapRef")

    prefix: str | None = Field(default=None, pattern=ENV_NAME, max_length=64, description="Put before each key.")
    secret_ref: ObjectRef | None = Field(default=None, description="A Secret in the ModelServer's namespace.")
    config_map_ref: ObjectRef | None = Field(default=None, description="A ConfigMap in the ModelServer's namespace.")


class TokenSecret(ApiModel):
    """The Secret key holding a Hugging Face token, for gated or private models."""

    name: str = Field(pattern=DNS_SUBDOMAIN, max_length=253, description="The Secret's name.")
    key: str = Field(default="HF_TOKEN", pattern=DATA_KEY, max_length=253, description="The key holding the token.")
