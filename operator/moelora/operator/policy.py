"""What ModelServer and LoRAAdapter authors may pick, judged against the allowlists the chart configures
(`policy.*` values, see settings.py): pure functions that return or raise the verdict.

Without them a ModelServer author could run any image under any ServiceAccount of the namespace, and a LoRAAdapter
author could make the agents send requests (with the server's credentials) to any endpoint and bucket.
"""

from __future__ import annotations

import fnmatch

from moelora.api import AdapterSource
from moelora.operator.errors import SpecProblem
from moelora.operator.settings import Settings


def check_image(image: str | None, settings: Settings) -> None:
    """SpecProblem(ImageNotAllowed) unless `image` (None: the operator's own) matches settings.allowed_images."""
    if image is None or image == settings.server_image:
        return
    if not any(fnmatch.fnmatchcase(image, pattern) for pattern in settings.allowed_images):
        raise SpecProblem(
            "ImageNotAllowed",
            f"image {image!r} is not in the operator's allowed images (chart value policy.allowedImages)",
        )


def check_service_account(name: str | None, settings: Settings) -> None:
    """SpecProblem(ServiceAccountNotAllowed) unless `name` (None: the chart's server account) is allowed."""
    if name is None or name == settings.server_service_account or name in settings.allowed_service_accounts:
        return
    raise SpecProblem(
        "ServiceAccountNotAllowed",
        f"serviceAccountName {name!r} is not in the operator's allowed ServiceAccounts "
        "(chart value policy.allowedServiceAccounts)",
    )


def adapter_source_problem(source: AdapterSource, *, server_endpoint: str | None, settings: Settings) -> str | None:
    """Why the agents must not fetch this adapter source (the LoRAAdapter's SourceNotAllowed), or None."""
    return source.refusal(
        server_endpoint=server_endpoint,
        allowed_endpoints=settings.allowed_s3_endpoints,
        allowed_buckets=settings.allowed_s3_buckets,
    )
