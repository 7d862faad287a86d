"""From a spec to the manifests it renders, pure: the Deployment (or StatefulSet, or leader-worker pods), its
Service, kernel ConfigMap, PodDisruptionBudget, autoscaler, gateway route, model cache and Secret Role, with the
engine's flags and env judged on the way (`children` assembles everything a ModelServer owns)."""
