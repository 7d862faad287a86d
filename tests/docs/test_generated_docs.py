"""Generated documentation stays in step with the models it is generated from."""

import pathlib

from moelora.api import docs

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_crd_reference_is_current() -> None:
    on_disk = (ROOT / "docs" / "crd-reference.md").read_text()
    assert on_disk == docs.render(), "stale: run `make docs` (python -m moelora.api.docs > docs/crd-reference.md)"


def test_crd_reference_lists_every_spec_field_with_its_default() -> None:
    text = docs.render()
    assert "| `spec.lora.maxLoraRank` | integer |  | `16` |" in text
    assert "| `spec.modelServer` | string | yes |" in text
    assert "one of 1, 8, 16, 32, 64, 128, 256, 320, 512" in text
