"""Secret values never leave the agent: redaction of messages, and credentials that do not print."""

from moelora.agent.errors import redact
from moelora.agent.reconcile import Record
from moelora.agent.store.source import Credentials
from moelora.api import FailureReason


def test_redact_replaces_every_secret_value() -> None:
    text = "signature for AKIDEXAMPLE with wJalrXUtnFEMI failed; token tok-123456"
    assert redact(text, {"wJalrXUtnFEMI", "tok-123456"}) == "signature for AKIDEXAMPLE with *** failed; token ***"
    assert redact("abc", {"", "ab"}) == "abc"  # too short to redact without mangling ordinary words


def test_credentials_never_print() -> None:
    creds = Credentials.from_secret(
        {
            "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
            "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI",
            "AWS_SESSION_TOKEN": "tok-123456",
        },
        secret_name="s3",
    )
    for text in (repr(creds), str(creds), f"{creds}"):
        assert "wJalrXUtnFEMI" not in text and "tok-123456" not in text and "AKIDEXAMPLE" not in text
    assert set(creds.values()) == {"AKIDEXAMPLE", "wJalrXUtnFEMI", "tok-123456"}


def test_a_secret_missing_its_keys_names_the_secret_not_the_values() -> None:
    try:
        Credentials.from_secret({"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE"}, secret_name="s3")
    except Exception as error:  # noqa: BLE001
        assert getattr(error, "reason", None) is FailureReason.SECRET_NOT_FOUND
        assert "AKIDEXAMPLE" not in str(error) and "'s3'" in str(error)
    else:
        raise AssertionError("expected SecretNotFound")


def test_status_carries_only_redacted_messages() -> None:
    record = Record(uid="u", name="a", served_name="a", spec_hash="h")
    record.fail(
        FailureReason.ACCESS_DENIED, redact("denied for wJalrXUtnFEMI", {"wJalrXUtnFEMI"}), permanent=True, now=0
    )
    assert "wJalrXUtnFEMI" not in record.state().model_dump_json()
