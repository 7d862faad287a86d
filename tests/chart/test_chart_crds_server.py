"""The CRDs `helm install` sends with the chart's defaults pass the API server's CRD checks (a server-side dry run
against the emulator, which refuses what apiextensions-apiserver refuses: see tests/local/test_crd_rules.py)."""

from __future__ import annotations

import pathlib

import helm_python as helm
import yaml

from moelora.local.apiserver import KubeAPI

CHART = pathlib.Path(__file__).resolve().parents[2] / "charts" / "moelora"


def test_the_charts_crds_pass_a_server_dry_run(tmp_path: pathlib.Path) -> None:
    manifests = helm.Chart.load(CHART).render({}, name="moelora", namespace="moelora-system", is_install=True)
    crds = [
        doc
        for path, text in sorted(manifests.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc and doc["kind"] == "CustomResourceDefinition"
    ]
    assert sorted(crd["metadata"]["name"] for crd in crds) == ["loraadapters.moelora.io", "modelservers.moelora.io"]
    rendered = tmp_path / "crds.yaml"
    rendered.write_text(yaml.safe_dump_all(crds))
    with KubeAPI() as kube:
        dry = kube.kubectl("apply", "--dry-run=server", "-f", str(rendered))
        assert dry.stdout.count("created (server dry run)") == 2
        kube.kubectl("apply", "-f", str(rendered))  # and for real, labels and keep annotation included
        assert len(kube.list("apiextensions.k8s.io/v1/customresourcedefinitions")) == 2
