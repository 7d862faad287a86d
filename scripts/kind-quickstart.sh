#!/usr/bin/env bash
# moelora on a local kind cluster, CPU only: creates the cluster, builds and loads both images, installs the chart,
# puts a generated tiny model and two adapters into an in-cluster S3, applies examples/kind/, waits until the
# ModelServer is Ready and the adapters Loaded, and queries the base model and each adapter.
#
# Usage: scripts/kind-quickstart.sh [--check]
#   --check  assert what a working install shows and exit non-zero at the first thing that is not so: the ModelServer
#            Ready and counting every adapter loaded, each adapter Loaded, /v1/models listing each adapter under the
#            base model, and each model's completion answered by that model. On a failure it prints what the cluster
#            shows (objects, events, operator and server logs). .github/workflows/e2e-kind.yml runs this.
#
# Needs: docker (running), kind, kubectl, helm, make and Python 3.11+ (the tiny model is made by the repository's
# own tooling in .venv, set up by `make bootstrap`). About 15-30 minutes the first time, mostly image builds.
# Idempotent: re-running reuses the cluster and upgrades the release. Remove it all: kind delete cluster --name moelora
#
# Settings (environment):
#   CLUSTER_NAME  kind cluster name (default moelora)
#   VLLM_IMAGE    base of the server image; kind has no GPUs, so vLLM's CPU image of the Dockerfile's VLLM_VERSION
#   PYTHON        Python with moelora.local's dependencies (default .venv/bin/python, made by `make bootstrap`)
#   S3_URL        use this S3 endpoint for the upload instead of port-forwarding the in-cluster one
#   SKIP_BUILD=1  reuse moelora/operator:dev and moelora/server:dev-cpu already in the local Docker
set -euo pipefail

CHECK=0
for arg in "$@"; do
  case "$arg" in
    --check) CHECK=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
    *) printf 'error: unknown argument %s (usage: %s [--check])\n' "$arg" "$0" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."

CLUSTER_NAME=${CLUSTER_NAME:-moelora}
# The server image's vLLM is stated once, in the Dockerfile; kind runs vLLM's CPU image of the same release.
VLLM_VERSION=$(sed -n 's/^ARG VLLM_VERSION=//p' Dockerfile)
[ -n "$VLLM_VERSION" ] || { printf 'error: no ARG VLLM_VERSION in the Dockerfile\n' >&2; exit 1; }
VLLM_IMAGE=${VLLM_IMAGE:-public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v${VLLM_VERSION}}
PYTHON=${PYTHON:-.venv/bin/python}
SKIP_BUILD=${SKIP_BUILD:-0}
S3_URL=${S3_URL:-}
OPERATOR_IMAGE=moelora/operator:dev
SERVER_IMAGE=moelora/server:dev-cpu
SYSTEM_NAMESPACE=moelora-system
DEMO_NAMESPACE=moelora-demo
OPERATOR_DEPLOYMENT=moelora-operator  # release moelora of chart moelora: the chart's "<fullname>-operator"
MODEL_SERVER=tiny-llama
ADAPTERS=(alpha beta)
CONTEXT="kind-${CLUSTER_NAME}"

step() { printf '\n==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
kc() { kubectl --context "$CONTEXT" "$@"; }

# What the cluster shows, for finding out why a check failed.
diagnose() {
  printf '\n==> what the cluster shows\n' >&2
  kc get nodes -o wide || true
  kc -n "$SYSTEM_NAMESPACE" get deployments,pods,poddisruptionbudgets -o wide || true
  kc -n "$SYSTEM_NAMESPACE" logs "deployment/$OPERATOR_DEPLOYMENT" --all-containers --tail 300 || true
  kc -n "$DEMO_NAMESPACE" get modelservers,loraadapters,deployments,services,pods -o wide || true
  kc -n "$DEMO_NAMESPACE" describe "modelserver/$MODEL_SERVER" || true
  kc -n "$DEMO_NAMESPACE" describe pods -l "moelora.io/model-server=$MODEL_SERVER" || true
  kc -n "$DEMO_NAMESPACE" logs -l "moelora.io/model-server=$MODEL_SERVER" --all-containers --prefix --tail 300 || true
  kc -n "$DEMO_NAMESPACE" get events --sort-by .lastTimestamp || true
}

FORWARDS=()
cleanup() {
  local status=$? pid
  for pid in "${FORWARDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  if [ "$status" != 0 ] && [ "$CHECK" = 1 ] && [ "$CLUSTER_UP" = 1 ]; then
    diagnose >&2
  fi
}
CLUSTER_UP=0
trap cleanup EXIT

# expect WHAT EXPRESSION: the JSON on stdin, bound to `d`, must make the Python EXPRESSION true, else the check fails.
expect() {
  "$PYTHON" -c 'import json, sys; d = json.load(sys.stdin); sys.exit(0 if eval(f"({sys.argv[2]})") else 1)' "$1" "$2" ||
    die "check failed: $1"
}

# port_forward TARGET REMOTE_PORT: forwards a free local port to it in the background and sets FORWARDED_PORT.
# (Not run in $(...): the forward must belong to this shell, so the EXIT trap can stop it.)
FORWARDED_PORT=
port_forward() {
  local target=$1 remote=$2 port log
  port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  log=$(mktemp)
  kc -n "$DEMO_NAMESPACE" port-forward "$target" "$port:$remote" >"$log" 2>&1 &
  FORWARDS+=("$!")
  for _ in $(seq 1 50); do
    if grep -q "Forwarding from" "$log"; then
      FORWARDED_PORT=$port
      return 0
    fi
    sleep 0.2
  done
  cat "$log" >&2
  die "port-forward to $target did not start"
}

step "checking the tools"
for tool in docker kind kubectl helm make; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is not installed (see the README's kind quickstart)"
done
docker info >/dev/null 2>&1 || die "the Docker engine is not running"
[ -x "$PYTHON" ] || make bootstrap

step "kind cluster $CLUSTER_NAME"
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
  echo "exists, reusing it" >&2
else
  kind create cluster --name "$CLUSTER_NAME" --wait 120s
fi
CLUSTER_UP=1

if [ "$SKIP_BUILD" != 1 ]; then
  step "building $OPERATOR_IMAGE (target operator)"
  docker build --target operator -t "$OPERATOR_IMAGE" .
  step "building $SERVER_IMAGE (target server, on $VLLM_IMAGE)"
  docker build --target server --build-arg "VLLM_IMAGE=$VLLM_IMAGE" -t "$SERVER_IMAGE" .
fi
step "loading the images into kind"
kind load docker-image --name "$CLUSTER_NAME" "$OPERATOR_IMAGE" "$SERVER_IMAGE"

# The chart's defaults (its CRDs, an operator watching every namespace), but for the images and where server pods run.
step "installing the chart (release moelora in $SYSTEM_NAMESPACE, server pods in $DEMO_NAMESPACE)"
kc create namespace "$DEMO_NAMESPACE" --dry-run=client -o yaml | kc apply -f -
helm upgrade --install moelora charts/moelora --kube-context "$CONTEXT" \
  --namespace "$SYSTEM_NAMESPACE" --create-namespace \
  --set "server.namespaces={$DEMO_NAMESPACE}" \
  --set "operator.image.repository=${OPERATOR_IMAGE%:*}" --set "operator.image.tag=${OPERATOR_IMAGE##*:}" \
  --set "server.image.repository=${SERVER_IMAGE%:*}" --set "server.image.tag=${SERVER_IMAGE##*:}" \
  --wait --timeout 5m

step "in-cluster S3 (examples/kind/s3.yaml)"
kc apply -f examples/kind/s3.yaml
kc -n "$DEMO_NAMESPACE" rollout status deployment/s3 --timeout 5m
if [ -z "$S3_URL" ]; then
  port_forward service/s3 9000
  S3_URL="http://127.0.0.1:$FORWARDED_PORT"
fi

step "generating a tiny model and two adapters, uploading them to $S3_URL"
S3_URL="$S3_URL" "$PYTHON" - "${ADAPTERS[@]}" <<'PY'
import os, pathlib, sys, tempfile

import boto3
from botocore.config import Config

from moelora.local.models import make_adapter, make_model

s3 = boto3.client("s3", endpoint_url=os.environ["S3_URL"], region_name="us-east-1",
                  aws_access_key_id="demo-access-key", aws_secret_access_key="demo-secret-key",
                  config=Config(s3={"addressing_style": "path"}))
bucket = "moelora-demo"
if bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
    s3.create_bucket(Bucket=bucket)

def upload(folder: pathlib.Path, prefix: str) -> None:
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder).as_posix()}")
    print(f"  s3://{bucket}/{prefix}/", file=sys.stderr)

with tempfile.TemporaryDirectory() as tmp:
    model = make_model(path=pathlib.Path(tmp) / "model")
    upload(model, "models/tiny-llama")
    for seed, name in enumerate(sys.argv[1:], start=1):
        adapter = make_adapter(model_dir=model, path=pathlib.Path(tmp) / name, base_model_name="moelora/tiny-llama",
                               rank=8, seed=seed)
        upload(adapter, f"adapters/{name}")
PY

step "applying examples/kind/ (ModelServer $MODEL_SERVER, LoRAAdapters ${ADAPTERS[*]})"
kc apply -f examples/kind/modelserver.yaml -f examples/kind/loraadapters.yaml

step "waiting for the ModelServer to be Ready (vLLM on CPU starts in a minute or two)"
kc -n "$DEMO_NAMESPACE" wait --for=condition=Ready "modelserver/$MODEL_SERVER" --timeout 20m
for adapter in "${ADAPTERS[@]}"; do
  kc -n "$DEMO_NAMESPACE" wait --for=jsonpath='{.status.phase}'=Loaded "loraadapter/$adapter" --timeout 10m
done
kc -n "$DEMO_NAMESPACE" get modelservers,loraadapters
if [ "$CHECK" = 1 ]; then
  kc -n "$DEMO_NAMESPACE" get "modelserver/$MODEL_SERVER" -o json |
    expect "ModelServer $MODEL_SERVER is Ready and counts ${#ADAPTERS[@]} adapters loaded, none failed" \
      "any(c['type'] == 'Ready' and c['status'] == 'True' for c in d['status']['conditions'])
       and d['status']['adapters'].get('desired') == d['status']['adapters'].get('loaded') == ${#ADAPTERS[@]}
       and not d['status']['adapters'].get('failed')"
fi

step "querying the endpoint (service/$MODEL_SERVER): the base model, then each adapter"
port_forward "service/$MODEL_SERVER" 8000
ENDPOINT="http://127.0.0.1:$FORWARDED_PORT/v1"
if [ "$CHECK" = 1 ]; then
  for adapter in "${ADAPTERS[@]}"; do
    curl -fsS "$ENDPOINT/models" |
      expect "/v1/models lists $adapter under $MODEL_SERVER" \
        "any(m['id'] == '$adapter' and m.get('parent') == '$MODEL_SERVER' for m in d['data'])"
  done
fi
for model in "$MODEL_SERVER" "${ADAPTERS[@]}"; do
  answer=$(curl -fsS "$ENDPOINT/completions" -H 'Content-Type: application/json' \
    -d "{\"model\": \"$model\", \"prompt\": \"the quick brown fox\", \"max_tokens\": 12, \"temperature\": 0}")
  if [ "$CHECK" = 1 ]; then
    expect "the completion asked of $model is answered by $model, with text" \
      "d['model'] == '$model' and d['choices'][0]['text'] and d['usage']['completion_tokens'] > 0" <<<"$answer"
  fi
  printf '%-12s ' "$model"
  "$PYTHON" -c 'import json, sys; print(repr(json.load(sys.stdin)["choices"][0]["text"]))' <<<"$answer"
done

if [ "$CHECK" = 1 ]; then
  step "check passed"
  exit 0
fi
step "done"
cat >&2 <<EOF
The stack stays up. Try:
  kubectl --context $CONTEXT -n $DEMO_NAMESPACE describe loraadapter alpha
  kubectl --context $CONTEXT -n $DEMO_NAMESPACE delete loraadapter beta     # unloaded from vLLM within seconds
Remove everything: kind delete cluster --name $CLUSTER_NAME
EOF
