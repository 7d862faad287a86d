"""The autoscaler of a ModelServer: an HPA, or a KEDA ScaledObject, on the ModelServer's scale subresource.

Both write spec.replicas through the scale subresource, and the operator renders the Deployment (or the
LeaderWorkerSet) from spec.replicas as always, so the two never fight over the workload's replica count. The signal
is vLLM's queue: requests waiting per replica.

Scaling to zero needs a second signal. KEDA brings a ScaledObject back from zero only when a trigger is active, a
prometheus trigger being active when its query's value exceeds activationThreshold (default 0), and reads an empty
result as 0 (kedacore/keda pkg/scalers/prometheus_scaler.go). vLLM's queue is a series of the pods themselves: with
no pod there is no series, the queue trigger is never active, and the server never wakes; nor does a queue that stays
empty under light load keep it up. The user's wakeQuery, on something that exists without pods (the gateway's
requests), is that second trigger.
"""

from __future__ import annotations

from typing import Any

from moelora.api import API_VERSION, AutoscalerEngine, AutoscalingSpec, ModelServerSpec
from moelora.operator.errors import SpecProblem
from moelora.operator.render import engine, naming

HPA_API_VERSION = "autoscaling/v2"
KEDA_API_VERSION = "keda.sh/v1alpha1"
# A new replica loads the model and its adapters for minutes; scaling down as soon as a queue empties would
# throw that away on every lull.
SCALE_DOWN_WINDOW_SECONDS = 600


def _target(name: str) -> dict[str, str]:
    return {"apiVersion": API_VERSION, "kind": "ModelServer", "name": name}


def queue_query(spec: ModelServerSpec, *, name: str, namespace: str) -> str:
    """PromQL of the server's total queue: vLLM labels its metrics with the served model name."""
    if spec.autoscaling is not None and spec.autoscaling.target.query:
        return spec.autoscaling.target.query
    served = engine.served_model_name(spec, name=name)
    return f'sum(vllm:num_requests_waiting{{namespace="{namespace}",model_name="{served}"}})'


def horizontal_pod_autoscaler(autoscaling: AutoscalingSpec, *, name: str, namespace: str) -> dict[str, Any]:
    target = autoscaling.target
    return {
        "apiVersion": HPA_API_VERSION,
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": namespace, "labels": naming.labels(name)},
        "spec": {
            "scaleTargetRef": _target(name),
            "minReplicas": autoscaling.min_replicas,
            "maxReplicas": autoscaling.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": target.metric_name},
                        "target": {"type": "AverageValue", "averageValue": str(target.waiting_requests_per_replica)},
                    },
                }
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_WINDOW_SECONDS}},
        },
    }


def wake_trigger(autoscaling: AutoscalingSpec) -> dict[str, Any] | None:
    """The trigger on target.wakeQuery: active while its value is above 0, and asking for at most one replica
    (KEDA's HPA wants ceil(value / threshold) of it, and the value is clamped to 1), so the queue alone scales out."""
    target = autoscaling.target
    if target.wake_query is None or target.prometheus_address is None:
        return None
    return {
        "type": "prometheus",
        "name": "wake",
        "metadata": {
            "serverAddress": target.prometheus_address,
            "query": f"clamp_max(({target.wake_query}), 1)",
            "threshold": "1",
            "activationThreshold": "0",
        },
    }


def scaled_object(spec: ModelServerSpec, *, name: str, namespace: str) -> dict[str, Any]:
    """Raises SpecProblem without a Prometheus to ask, or for minReplicas 0 without a wake query (the CRD refuses
    both too; a stored object may predate its rules)."""
    autoscaling = spec.autoscaling
    if autoscaling is None or autoscaling.target.prometheus_address is None:
        raise SpecProblem("PrometheusAddressMissing", "autoscaling.engine keda needs target.prometheusAddress")
    wake = wake_trigger(autoscaling)
    if autoscaling.min_replicas == 0 and wake is None:
        raise SpecProblem(
            "WakeQueryMissing",
            "autoscaling.minReplicas 0 needs target.wakeQuery: PromQL of a metric that exists while no pod runs "
            "(e.g. the rate of requests the gateway receives for this server); the queue metric is the pods' own, "
            "so at zero pods KEDA would never scale the server up again",
        )
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": {"name": name, "namespace": namespace, "labels": naming.labels(name)},
        "spec": {
            "scaleTargetRef": _target(name),
            "minReplicaCount": autoscaling.min_replicas,
            "maxReplicaCount": autoscaling.max_replicas,
            "cooldownPeriod": SCALE_DOWN_WINDOW_SECONDS,  # before scaling to zero
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_WINDOW_SECONDS}}
                }
            },
            "triggers": [
                {
                    "type": "prometheus",
                    "name": "queue",
                    "metadata": {
                        "serverAddress": autoscaling.target.prometheus_address,
                        "query": queue_query(spec, name=name, namespace=namespace),
                        # KEDA divides the query's value by the replica count before comparing (AverageValue).
                        "threshold": str(autoscaling.target.waiting_requests_per_replica),
                    },
                },
                *([wake] if wake is not None else []),
            ],
        },
    }


def autoscaler(spec: ModelServerSpec, *, name: str, namespace: str) -> dict[str, Any] | None:
    """The HPA or ScaledObject spec.autoscaling asks for; None without autoscaling."""
    if spec.autoscaling is None:
        return None
    if spec.autoscaling.engine == AutoscalerEngine.KEDA:
        return scaled_object(spec, name=name, namespace=namespace)
    return horizontal_pod_autoscaler(spec.autoscaling, name=name, namespace=namespace)
