"""The S3 connections each preparation holds, so that cancelling it (its adapter deleted or changed) closes them.

botocore offers no way to interrupt a call blocked in a socket read, nor a hook that sees the connection a call
uses. `track(client)` gives the client's connection pools a subclass that attaches each connection, while a thread
holds it, to the Watch that thread works for (guard.working_for); Watch.cancel shuts those sockets down. The same
client also refuses to start a call, or to retry one, for a cancelled watch, so a call cut off does not reconnect.
It reaches into botocore's URLLib3Session (`_manager`, `_pool_classes_by_scheme`): make_client fails at once if a
botocore release renames them, and tests/agent/test_deletes_free.py checks a cut-off call on the pinned one.
"""

from __future__ import annotations

from typing import Any

from botocore.awsrequest import AWSHTTPConnectionPool, AWSHTTPSConnectionPool

from moelora.agent.store.guard import Cancelled, current

_OWNER = "_moelora_watch"  # the attribute naming, on a connection in use, the watch it is attached to


class _Attaching:
    """A connection pool whose connections are attached to the taking thread's watch until they come back."""

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)  # type: ignore[misc]
        watch = current()
        if watch is not None:
            try:
                watch.attach(conn)
            except Cancelled:
                super()._put_conn(conn)  # type: ignore[misc]
                raise
            setattr(conn, _OWNER, watch)
        return conn

    def _put_conn(self, conn: Any) -> None:
        watch = getattr(conn, _OWNER, None)
        if watch is not None:
            watch.detach(conn)
            setattr(conn, _OWNER, None)
        super()._put_conn(conn)  # type: ignore[misc]


class _HTTPPool(_Attaching, AWSHTTPConnectionPool):
    pass


class _HTTPSPool(_Attaching, AWSHTTPSConnectionPool):
    pass


def _refuse_if_cancelled(**_: Any) -> None:
    watch = current()
    if watch is not None and watch.cancelled.is_set():
        raise Cancelled()


def track(client: Any) -> Any:
    """`client`, its connections attached to the watch of the thread using them; returns it."""
    session = client._endpoint.http_session
    pools = {"http": _HTTPPool, "https": _HTTPSPool}
    session._pool_classes_by_scheme = pools  # proxy managers made later read it
    session._manager.pool_classes_by_scheme = pools
    # Raised from these events, Cancelled leaves the call: a cut-off read is not retried on a new connection.
    client.meta.events.register_first("before-call.s3", _refuse_if_cancelled)
    client.meta.events.register_first("needs-retry.s3", _refuse_if_cancelled)
    return client
