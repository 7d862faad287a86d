"""spec.autoscaling: replicas chosen from vLLM's request queue, by a HorizontalPodAutoscaler or by KEDA."""

from __future__ import annotations

import enum

from pydantic import ConfigDict, Field

from moelora.api.common import ApiModel

QUEUE_METRIC = "vllm:num_requests_waiting"


class AutoscalerEngine(str, enum.Enum):
    """What scales the server: hpa or keda."""

    HPA = "hpa"
    KEDA = "keda"


class AutoscalingTarget(ApiModel):
    """The queue length per replica the autoscaler keeps, and where it reads it."""

    waiting_requests_per_replica: int = Field(
        default=4,
        ge=1,
        le=100000,
        description=f"Requests waiting in vLLM's queue ({QUEUE_METRIC}) per replica, averaged over the replicas.",
    )
    metric_name: str = Field(
        default=QUEUE_METRIC,
        min_length=1,
        max_length=253,
        description="hpa: the name under which the custom metrics API (e.g. prometheus-adapter) serves the queue "
        "metric of each pod.",
    )
    prometheus_address: str | None = Field(
        default=None,
        pattern=r"^https?://\S+$",
        max_length=512,
        description="keda: the Prometheus that scrapes the server's pods, e.g. http://prometheus.monitoring:9090.",
    )
    # 2 KiB each: the largest ModelServer must fit twice into 256 KiB of annotations (tests/api/test_max_sizes.py).
    query: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        description="keda: the PromQL of the total queue. Default: the sum of the queue metric over this server's "
        "namespace and served model name.",
    )
    wake_query: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        description="keda: PromQL of a metric that exists while no pod of the server runs, one series, e.g. the "
        "rate of requests your gateway receives for it: any value above 0 keeps (or brings back) one replica. "
        "Required with minReplicas 0, as the queue metric is the pods' own and vanishes with them.",
    )


class AutoscalingSpec(ApiModel):
    """While set, the autoscaler writes spec.replicas (through the scale subresource) and the operator follows it."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.maxReplicas >= self.minReplicas",
                    "message": "maxReplicas must be at least minReplicas",
                    "fieldPath": ".maxReplicas",
                },
                {
                    "rule": "self.engine == 'keda' || self.minReplicas >= 1",
                    "message": "minReplicas 0 needs engine keda (an HPA cannot scale to zero)",
                    "fieldPath": ".minReplicas",
                },
                {
                    "rule": "self.minReplicas >= 1 || has(self.target.wakeQuery)",
                    "message": "minReplicas 0 needs target.wakeQuery, a metric that exists while no pod runs",
                    "fieldPath": ".target.wakeQuery",
                },
                {
                    "rule": "self.engine != 'keda' || has(self.target.prometheusAddress)",
                    "message": "engine keda needs target.prometheusAddress",
                    "fieldPath": ".target.prometheusAddress",
                },
            ]
        }
    )

    engine: AutoscalerEngine = Field(default=AutoscalerEngine.HPA, description="hpa or keda.")
    min_replicas: int = Field(
        default=1, ge=0, le=1000, description="Fewest replicas (0 only with keda and target.wakeQuery)."
    )
    max_replicas: int = Field(ge=1, le=1000, description="Most replicas.")
    target: AutoscalingTarget = Field(default_factory=AutoscalingTarget, json_schema_extra={"default": {}})
