"""S3 keys and listings: what is refused before a byte is downloaded."""

import pytest

from moelora.agent.errors import AdapterError
from moelora.agent.store.source import Listing, RemoteObject, S3Location, check_listing, parse_s3_uri, safe_relpath
from moelora.api import FailureReason


@pytest.mark.parametrize(
    "uri, bucket, prefix",
    [
        ("s3://b/a/x", "b", "a/x/"),
        ("s3://b/a/x/", "b", "a/x/"),
        ("s3://b", "b", ""),
        ("s3://b/", "b", ""),
    ],
)
def test_parse_uri_always_gives_a_directory_prefix(uri: str, bucket: str, prefix: str) -> None:
    assert parse_s3_uri(uri) == S3Location(bucket=bucket, prefix=prefix)


@pytest.mark.parametrize(
    "key, rel",
    [
        ("p/adapter_config.json", "adapter_config.json"),
        ("p/sub/dir/x.safetensors", "sub/dir/x.safetensors"),
        ("p/..hidden", "..hidden"),
    ],
)
def test_safe_keys(key: str, rel: str) -> None:
    assert safe_relpath(key, prefix="p/") == rel


@pytest.mark.parametrize(
    "key",
    [
        "p/../etc/passwd",
        "p/a/../../x",
        "p//etc/passwd",
        "p/a\\..\\x",
        "p/./x",
        "p/a/",
        "p/",
        "q/x",
        "p/C:/x",
        "p/a\0b",
    ],
)
def test_escaping_keys_are_refused(key: str) -> None:
    with pytest.raises(AdapterError) as caught:
        safe_relpath(key, prefix="p/")
    assert caught.value.reason is FailureReason.UNSAFE_KEY


def listing(*names: str, size: int = 10) -> Listing:
    return Listing(
        location=S3Location("b", "p/"),
        objects=tuple(RemoteObject(key="p/" + n, relpath=n, size=size, etag='"e"') for n in sorted(names)),
    )


@pytest.mark.parametrize(
    "names, size, reason",
    [
        (
            ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"),
            10,
            FailureReason.UNSAFE_WEIGHTS_FORMAT,
        ),
        (("adapter_model.safetensors",), 10, FailureReason.CONFIG_MISSING),
        (("adapter_config.json",), 10, FailureReason.WEIGHTS_MISSING),
        (("adapter_config.json", "adapter_model.safetensors"), 600, FailureReason.TOO_LARGE),
    ],
)
def test_listing_refusals(names: tuple[str, ...], size: int, reason: FailureReason) -> None:
    with pytest.raises(AdapterError) as caught:
        check_listing(listing(*names, size=size), max_bytes=1000)
    assert caught.value.reason is reason


def test_version_changes_with_any_etag_and_not_with_quotes() -> None:
    a = listing("adapter_config.json", "adapter_model.safetensors")
    b = Listing(
        location=a.location,
        objects=(a.objects[0], RemoteObject(key=a.objects[1].key, relpath=a.objects[1].relpath, size=10, etag='"f"')),
    )
    c = Listing(
        location=a.location,
        objects=tuple(RemoteObject(key=o.key, relpath=o.relpath, size=o.size, etag="e") for o in a.objects),
    )
    assert a.version != b.version and a.version == c.version and len(a.version) == 32


@pytest.mark.parametrize(
    "wire, allowed",
    [
        ({}, True),
        ({"endpointUrl": "http://169.254.169.254"}, False),
        ({"endpointUrl": "https://s3.b.example.com"}, False),  # listed, but no credentials of its own
        ({"endpointUrl": "https://s3.b.example.com", "credentialsSecret": {"name": "b"}}, True),
        ({"uri": "s3://other-team/x/"}, False),
    ],
)
def test_check_allowed_refuses_before_any_request(wire: dict, allowed: bool) -> None:
    from moelora.agent.store.source import check_allowed
    from moelora.api import AdapterSource

    source = AdapterSource.model_validate({"uri": "s3://team-a/x/", **wire})
    policy = {"allowed_endpoints": ("https://s3.b.example.com",), "allowed_buckets": ("team-*",)}
    if allowed:
        check_allowed(source, server_endpoint="http://minio:9000", **policy)
    else:
        with pytest.raises(AdapterError) as caught:
            check_allowed(source, server_endpoint="http://minio:9000", **policy)
        assert caught.value.reason == FailureReason.SOURCE_NOT_ALLOWED
