# syntax=docker/dockerfile:1
# Two images from one source tree, one wheel:
#   operator  slim Python + moelora[operator] (kopf, kubernetes) from the hash-pinned image/operator.lock: no torch,
#             no vLLM; runs as a non-root user.
#   server    vLLM's own serving image + moelora[agent] (the adapter agent), the moelora vLLM plugin (registered
#             through the `vllm.general_plugins` entry point) and the bundled kernel configs (package data of
#             moelora.kernels, inside the wheel).
#
#   docker build --target operator -t ghcr.io/moelora/moelora-operator:0.1.0 .
#   docker build --target server   -t ghcr.io/moelora/moelora-server:0.1.0-vllm0.26.0 .
#
# .github/workflows/images.yml builds both with these tags (the operator for amd64 and arm64) and pushes them.
#
# The server's base is pinned: a vLLM upgrade changes the kernels and flags the plugin and the operator target, so
# it is a deliberate edit of VLLM_VERSION here and of the chart's server.image.tag (a test checks they agree; the
# images workflow tags the server image from it). A CPU-only cluster (the kind quickstart) builds the same target on
# vLLM's CPU image: --build-arg VLLM_IMAGE=<vLLM CPU image of the same version>.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
ARG VLLM_VERSION=0.26.0
ARG VLLM_IMAGE=vllm/vllm-openai:v${VLLM_VERSION}

# --- the moelora wheel, built once for both images ------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml ./
COPY operator/ operator/
COPY image/ image/
COPY kernels/ kernels/
# A requirements line per image naming the wheel file exactly: installing by path, never by name, so no
# same-named distribution from an index can ever stand in for it.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && wheel_file="$(find /wheels -name 'moelora-*.whl')" \
 && echo "moelora[operator] @ file://${wheel_file}" > /wheels/operator.txt \
 && echo "moelora[agent] @ file://${wheel_file}" > /wheels/server.txt

# --- operator -------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS operator
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Every dependency comes from the lock, as a wheel whose hash it names, so nothing floats at build time and nothing
# is compiled; moelora itself goes in without resolving anything, and pip check fails the build if the lock lacks a
# requirement of what is installed.
RUN --mount=type=bind,source=image/operator.lock,target=/tmp/operator.lock \
    --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    pip install --no-cache-dir --only-binary=:all: --require-hashes --no-deps -r /tmp/operator.lock \
 && pip install --no-cache-dir --no-deps -r /wheels/operator.txt \
 && pip check \
 && python3 -c "import kopf, moelora.operator" \
 && groupadd --system --gid 65532 moelora \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin moelora
# Numeric, so the kubelet can verify runAsNonRoot without a passwd lookup.
USER 65532:65532
ENTRYPOINT ["python3", "-m", "moelora.operator"]

# --- server ---------------------------------------------------------------------------------------------------
FROM ${VLLM_IMAGE} AS server
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
# Constrain to what the base already has, so adding the agent can never move vLLM's own dependencies (pydantic,
# pyyaml, ...): pip fails the build instead. Then prove the plugin is registered where vLLM looks for it.
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    python3 -m pip list --format=freeze > /tmp/base-constraints.txt \
 && python3 -m pip install --no-cache-dir --constraint /tmp/base-constraints.txt -r /wheels/server.txt \
 && rm /tmp/base-constraints.txt \
 && python3 -c "from importlib.metadata import entry_points; \
assert [e.value for e in entry_points(group='vllm.general_plugins') if e.name == 'moelora'] == ['moelora.vllm_plugin:register']; \
import moelora.agent, moelora.vllm_plugin, moelora.kernels" \
 && groupadd --system --gid 2000 moelora \
 && useradd --system --uid 2000 --gid 2000 --create-home --home-dir /home/moelora --shell /usr/sbin/nologin moelora \
 && mkdir -p /var/lib/moelora/adapters /models \
 && chown 2000:2000 /var/lib/moelora/adapters /models
# vLLM, Triton and the Hugging Face hub cache under $HOME; the pod mounts emptyDirs over the adapter and model dirs.
ENV HOME=/home/moelora \
    HF_HOME=/home/moelora/.cache/huggingface \
    VLLM_NO_USAGE_STATS=1
USER 2000:2000
WORKDIR /home/moelora
# The operator's pods give both containers an explicit command (vLLM's API server, or python3 -m moelora.agent);
# run by hand, the image serves like vLLM's own.
ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server"]
