"""Table columns of built-in kinds, as a real API server prints them (the cells kubectl shows for pods, deployments...).

A Column has a definition (name, type, format, description, priority: kubectl shows priority > 0 only with -o wide)
and a function from an object to its cell. Ages are rendered on the server, as Kubernetes does.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any

import attrs

Cell = Callable[[Mapping[str, Any], datetime.datetime], Any]


@attrs.frozen(kw_only=True)
class Column:
    name: str
    type: str = "string"
    format: str = ""
    description: str = ""
    priority: int = 0
    cell: Cell

    def definition(self) -> dict[str, Any]:
        """The meta.k8s.io TableColumnDefinition."""
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        }


def human_duration(seconds: float) -> str:
    """A duration the way kubectl's AGE column writes it: 45s, 3m20s, 15m, 5h10m, 20h, 3d4h, 90d, 2y10d."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    days = hours // 24
    if days < 365 * 2:
        return f"{days}d"
    if days < 365 * 8:
        return f"{days // 365}y{days % 365}d" if days % 365 else f"{days // 365}y"
    return f"{days // 365}y"


def _parse_time(value: Any) -> datetime.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def age(timestamp: Any, now: datetime.datetime | None = None) -> str:
    """The time since a Kubernetes timestamp as kubectl prints it; <unknown> without one, <invalid> if unparsable."""
    if not timestamp:
        return "<unknown>"
    when = _parse_time(timestamp)
    if when is None:
        return "<invalid>"
    return human_duration(((now or datetime.datetime.now(tz=datetime.UTC)) - when).total_seconds())


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


NAME = Column(
    name="Name",
    format="name",
    description="The object's name, unique within its namespace and kind.",
    cell=lambda obj, _: _meta(obj).get("name"),
)
AGE = Column(
    name="Age",
    description="The time since the object was created (metadata.creationTimestamp).",
    cell=lambda obj, now: age(_meta(obj).get("creationTimestamp"), now),
)
NAME_AGE = [NAME, AGE]


def _pod_ready(pod: Mapping[str, Any], _: datetime.datetime) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    total = len((pod.get("spec") or {}).get("containers") or []) or len(statuses)
    return f"{sum(1 for status in statuses if status.get('ready'))}/{total}"


def _pod_status(pod: Mapping[str, Any], _: datetime.datetime) -> str:
    """What kubectl shows as a pod's STATUS: a waiting or terminated container's reason, else the phase."""
    status = pod.get("status") or {}
    reason = status.get("reason") or status.get("phase") or "Unknown"
    for init in status.get("initContainerStatuses") or []:
        state = init.get("state") or {}
        if (state.get("terminated") or {}).get("exitCode", 0) != 0:
            return f"Init:{state['terminated'].get('reason') or 'Error'}"
        if (state.get("waiting") or {}).get("reason") not in (None, "PodInitializing"):
            return f"Init:{state['waiting']['reason']}"
    for container in reversed(status.get("containerStatuses") or []):
        state = container.get("state") or {}
        if (waiting := state.get("waiting")) and waiting.get("reason"):
            reason = waiting["reason"]
        elif terminated := state.get("terminated"):
            reason = terminated.get("reason") or (
                f"Signal:{terminated['signal']}"
                if terminated.get("signal")
                else f"ExitCode:{terminated.get('exitCode')}"
            )
    if _meta(pod).get("deletionTimestamp"):
        return "Terminating"
    return reason


def _pod_restarts(pod: Mapping[str, Any], now: datetime.datetime) -> str:
    """Restarts, with the time since the last one as kubectl shows it: `2 (5m ago)`."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    restarts = sum(int(status.get("restartCount") or 0) for status in statuses)
    finished = [
        when
        for status in statuses
        if (when := _parse_time(((status.get("lastState") or {}).get("terminated") or {}).get("finishedAt")))
    ]
    if restarts and finished:
        return f"{restarts} ({human_duration((now - max(finished)).total_seconds())} ago)"
    return str(restarts)


def _ports(service: Mapping[str, Any], _: datetime.datetime) -> str:
    ports = []
    for port in (service.get("spec") or {}).get("ports") or []:
        node = f":{port['nodePort']}" if port.get("nodePort") else ""
        ports.append(f"{port.get('port')}{node}/{port.get('protocol') or 'TCP'}")
    return ",".join(ports) or "<none>"


def _external_ip(service: Mapping[str, Any], _: datetime.datetime) -> str:
    spec = service.get("spec") or {}
    ingress = ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    found = [entry.get("ip") or entry.get("hostname") for entry in ingress] + list(spec.get("externalIPs") or [])
    if spec.get("type") == "LoadBalancer" and not found:
        return "<pending>"
    if spec.get("type") == "ExternalName":
        return str(spec.get("externalName"))
    return ",".join(str(ip) for ip in found if ip) or "<none>"


def _at(*path: str, default: Any = None) -> Cell:
    def cell(obj: Mapping[str, Any], _: datetime.datetime) -> Any:
        value: Any = obj
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        return default if value is None else value

    return cell


def _count(*fields: str) -> Cell:
    return lambda obj, _: sum(len(obj.get(field) or {}) for field in fields)


def _containers(template: bool, what: str) -> Cell:
    def cell(obj: Mapping[str, Any], _: datetime.datetime) -> str:
        spec = obj.get("spec") or {}
        if template:
            spec = (spec.get("template") or {}).get("spec") or {}
        return ",".join(str(container.get(what)) for container in spec.get("containers") or [])

    return cell


def _selector(obj: Mapping[str, Any], _: datetime.datetime) -> str:
    selector = (obj.get("spec") or {}).get("selector") or {}
    labels = selector.get("matchLabels", selector if "matchExpressions" not in selector else {})
    return ",".join(f"{key}={value}" for key, value in labels.items()) or "<none>"


def _event_times(event: Mapping[str, Any], now: datetime.datetime) -> tuple[str, str, int]:
    """(last seen, first seen, count) as printEvent reckons them: eventTime when firstTimestamp is unset, the first
    for the last, a series' own last time and count, and 1 for a singleton without a count."""
    first = age(event.get("firstTimestamp") or event.get("eventTime"), now)
    last = age(event["lastTimestamp"], now) if event.get("lastTimestamp") else first
    count = int(event.get("count") or 0)
    if series := event.get("series"):
        last, count = age(series.get("lastObservedTime"), now), int(series.get("count") or 0)
    elif count == 0:
        count = 1
    return last, first, count


def _event_object(event: Mapping[str, Any], _: datetime.datetime) -> str:
    involved = event.get("involvedObject") or {}
    kind = str(involved.get("kind") or "").lower()
    return f"{kind}/{involved['name']}" if involved.get("name") else kind


def _event_source(event: Mapping[str, Any], _: datetime.datetime) -> str:
    source = event.get("source") or {}
    component = source.get("component") or event.get("reportingComponent") or ""
    instance = source.get("host") or event.get("reportingInstance") or ""
    return f"{component}, {instance}" if instance else component


# k8s.io/kubernetes pkg/printers/internalversion/printers.go: eventColumnDefinitions and printEvent (the server
# prints the wide cells too; kubectl shows priority 1 only with -o wide).
_EVENT_COLUMNS = [
    Column(name="Last Seen", description="The time at which the most recent occurrence was recorded.",
           cell=lambda event, now: _event_times(event, now)[0]),
    Column(name="Type", description="Type of this event (Normal, Warning).", cell=_at("type", default="")),
    Column(name="Reason", description="Why the event was emitted, in CamelCase.", cell=_at("reason", default="")),
    Column(name="Object", description="The object this event is about.", cell=_event_object),
    Column(name="Subobject", priority=1, description="The part of the object (fieldPath).",
           cell=_at("involvedObject", "fieldPath", default="")),
    Column(name="Source", priority=1, description="The component reporting this event.", cell=_event_source),
    Column(name="Message", description="A human-readable description of the status of this operation.",
           cell=lambda event, _: str(event.get("message") or "").strip()),
    Column(name="First Seen", priority=1, description="The time at which the event was first recorded.",
           cell=lambda event, now: _event_times(event, now)[1]),
    Column(name="Count", priority=1, description="The number of times this event has occurred.",
           cell=lambda event, now: _event_times(event, now)[2]),
    Column(name="Name", priority=1, format="name", description=NAME.description, cell=NAME.cell),
]  # fmt: skip

BUILTIN_COLUMNS: dict[tuple[str, str | None], list[Column]] = {
    ("", "Event"): _EVENT_COLUMNS,
    ("", "Pod"): [
        NAME,
        Column(name="Ready", description="Ready containers of all containers.", cell=_pod_ready),
        Column(name="Status", description="The pod's phase, or why a container is not running.", cell=_pod_status),
        Column(name="Restarts", description="Container restarts, and the time since the last.", cell=_pod_restarts),
        AGE,
        Column(
            name="IP", priority=1, description="The pod's IP address.", cell=_at("status", "podIP", default="<none>")
        ),
        Column(
            name="Node", priority=1, description="The node it runs on.", cell=_at("spec", "nodeName", default="<none>")
        ),
    ],
    ("apps", "Deployment"): [
        NAME,
        Column(
            name="Ready",
            description="Ready replicas of the desired replicas.",
            cell=lambda obj, now: (
                f"{_at('status', 'readyReplicas', default=0)(obj, now)}/{_at('spec', 'replicas', default=1)(obj, now)}"
            ),
        ),
        Column(
            name="Up-to-date",
            type="integer",
            description="Replicas of the current template.",
            cell=_at("status", "updatedReplicas", default=0),
        ),
        Column(
            name="Available",
            type="integer",
            description="Replicas available to serve.",
            cell=_at("status", "availableReplicas", default=0),
        ),
        AGE,
        Column(name="Containers", priority=1, description="Container names.", cell=_containers(True, "name")),
        Column(name="Images", priority=1, description="Container images.", cell=_containers(True, "image")),
        Column(name="Selector", priority=1, description="The pods' label selector.", cell=_selector),
    ],
    ("", "Service"): [
        NAME,
        Column(name="Type", description="How the service is exposed.", cell=_at("spec", "type", default="ClusterIP")),
        Column(
            name="Cluster-IP", description="The cluster-internal IP.", cell=_at("spec", "clusterIP", default="<none>")
        ),
        Column(name="External-IP", description="External addresses.", cell=_external_ip),
        Column(name="Port(s)", description="Ports served.", cell=_ports),
        AGE,
        Column(name="Selector", priority=1, description="The pods it selects.", cell=_selector),
    ],
    ("", "ConfigMap"): [
        NAME,
        Column(name="Data", type="integer", description="Keys.", cell=_count("data", "binaryData")),
        AGE,
    ],
    ("", "Secret"): [
        NAME,
        Column(name="Type", description="The secret's type.", cell=_at("type", default="Opaque")),
        Column(name="Data", type="integer", description="Keys.", cell=_count("data")),
        AGE,
    ],
}
