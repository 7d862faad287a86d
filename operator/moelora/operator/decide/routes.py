"""Where the gateway sends each adapter's requests: the header value its body-based router ConfigMap maps its name
to (render/gateway.py says why each adapter has a ConfigMap of its own). Pure.

Through the server's pool by default, where the endpoint picker chooses a pod and any pod serves the adapter. With
routeToHome, an adapter placed on one pod alone goes straight to that pod, but only while nothing can be lost there:
the move that made it its home has ended (no old home draining), the pod's agent reports it loaded, and the pod is
ready. A move, a pod restarting or an adapter still loading sends it back through the pool until then, so a route
switches to a pod only once the pod can answer.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from moelora.api import AdapterPlacement
from moelora.operator.decide.indexes import AdapterEntry, GatewayRouting
from moelora.operator.render.gateway import home_header


def home(placed: AdapterPlacement | None, *, loaded: Collection[str], ready: Mapping[str, bool]) -> str | None:
    """The pod an adapter can be sent to alone, if any: its one home, its move done, loaded there and ready."""
    # Its assignment is exactly its target (replicas are the target and any old home still draining), one pod.
    if placed is None or len(placed.target) != 1 or list(placed.replicas) != list(placed.target):
        return None
    [pod] = placed.target
    return pod if pod in loaded and ready.get(pod, False) else None


def header(
    entry: AdapterEntry,
    routing: GatewayRouting | None,
    *,
    placed: AdapterPlacement | None,
    loaded: Collection[str],
    ready: Mapping[str, bool],
) -> str | None:
    """The header value the adapter's name maps to; None: no ConfigMap (no gateway routing, or an adapter that no
    pod serves, or one served under the base model's own name, which the server's ConfigMap maps)."""
    served = entry.served or entry.name
    if routing is None or entry.phase == "Failed" or served == routing.base:
        return None
    pod = home(placed, loaded=loaded, ready=ready) if routing.home else None
    return routing.base if pod is None else home_header(routing.base, pod)
