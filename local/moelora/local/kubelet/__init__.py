"""Rendered pods run as local processes: the kubelet and the Deployment controller the emulator does not have.

What belongs here is turning pod templates into running processes, in three steps: `plan` (pure: a Pod object ->
what to run, where its volumes are, which local ports it uses), `pod` (one pod's processes, supervised and probed),
`controller` (`LocalKubelet`: Deployments in the API server -> pods, Pod objects and status).
"""

from moelora.local.kubelet.controller import LocalKubelet
from moelora.local.kubelet.plan import ContainerPlan, PodPlan, Probe, plan_pod
from moelora.local.kubelet.pod import GRACE, LocalPod, stop_pods

__all__ = ["GRACE", "ContainerPlan", "LocalKubelet", "LocalPod", "PodPlan", "Probe", "plan_pod", "stop_pods"]
