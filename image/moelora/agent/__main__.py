"""`python3 -m moelora.agent` runs the sidecar; `python3 -m moelora.agent fetch-model s3://bucket/prefix DEST` fetches
a base model for the init container (S3 endpoint and credentials from the environment, as for adapters)."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import pathlib
import signal
import sys
from types import FrameType

from moelora.agent.errors import AdapterError, TransientError


def run_agent() -> int:
    from moelora.agent.report import kube as kube_module
    from moelora.agent.report.metrics import Metrics, StatusServer
    from moelora.agent.runner import Agent
    from moelora.agent.serve import admin_key
    from moelora.agent.serve.ondemand import ADDRESS_FILE, ResolveServer
    from moelora.agent.serve.vllm import HealthWatch, VllmClient
    from moelora.agent.settings import SettingsError, from_env

    try:
        settings = from_env()
    except SettingsError as error:
        print(f"moelora agent: {error}", file=sys.stderr)
        return 2
    kube = kube_module.Kube(client=kube_module.api_client(), namespace=settings.namespace)
    key = admin_key.create(settings.admin_key_file)
    vllm = VllmClient(base_url=settings.vllm_url, admin_key=key, api_key=settings.vllm_api_key)
    metrics = Metrics()
    # The watcher wakes the agent's loop on every change; the agent reads the watcher's snapshot.
    watcher = kube_module.AdapterWatcher(
        kube=kube,
        model_server=settings.model_server,
        on_change=lambda: agent.wake.set(),
        pod=settings.pod_name if settings.placement else None,
    )
    agent = Agent(
        settings=settings, kube=kube, desired=watcher, vllm=vllm, metrics=metrics, catalogue=watcher.server_adapters
    )
    # vLLM's LoRA resolver (moelora.vllm_plugin.resolver) finds this listener through the file beside the admin key.
    resolver = ResolveServer(
        resolutions=agent.resolutions,
        key=key,
        timeout=settings.resolve_seconds,
        address_file=settings.admin_key_file.parent / ADDRESS_FILE,
    )
    health = HealthWatch(vllm, on_change=agent.wake.set)  # a vLLM that dies or comes back: seen within a second
    server = StatusServer(port=settings.port, metrics=metrics, ready=lambda: agent.is_ready, alive=agent.alive)

    def stop(signum: int, frame: FrameType | None) -> None:
        logging.getLogger("moelora.agent").info("signal %d: stopping", signum)
        agent.stop()

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1` prints every thread's stack: what a stuck agent waits on
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.start()
    resolver.start()
    watcher.start()
    health.start()
    logging.getLogger("moelora.agent").info(
        "agent for ModelServer %s/%s on pod %s: vLLM %s, cache %s (%d bytes), status on :%d",
        settings.namespace,
        settings.model_server,
        settings.pod_name,
        settings.vllm_url,
        settings.cache_dir,
        settings.cache_bytes,
        server.port,
    )
    try:
        agent.run()
    finally:
        health.stop()
        watcher.stop()
        resolver.stop()
        server.stop()
    return 0


def fetch_model(uri: str, dest: pathlib.Path) -> int:
    from moelora.agent.store.fetch import fetch_tree
    from moelora.agent.store.source import ClientConfig, list_source, make_client, parse_s3_uri

    log = logging.getLogger("moelora.agent")
    try:
        client = make_client(ClientConfig())
        listing = list_source(client, location=parse_s3_uri(uri))
        log.info("fetching %d files (%d bytes) from %s into %s", len(listing.objects), listing.total_bytes, uri, dest)
        fetch_tree(client=client, listing=listing, dest=dest)
    except (AdapterError, TransientError) as error:
        print(f"moelora fetch-model: {error}", file=sys.stderr)
        return 1
    log.info("model ready in %s", dest)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m moelora.agent", description=__doc__)
    commands = parser.add_subparsers(dest="command")
    fetch = commands.add_parser("fetch-model", help="download s3://bucket/prefix into DEST (init container)")
    fetch.add_argument("uri")
    fetch.add_argument("dest", type=pathlib.Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("botocore", "boto3", "s3transfer", "urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.command == "fetch-model":
        return fetch_model(args.uri, args.dest)
    return run_agent()


if __name__ == "__main__":
    sys.exit(main())
