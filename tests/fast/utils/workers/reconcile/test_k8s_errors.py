"""Our errors (``k8s_errors``): one rule for which failures reject the watch cursor and which keep
it, whatever shape the error has, and the connection error's kinds."""

from __future__ import annotations

import errno
import json
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from miles.utils.k8s_testenv.testing.k8s_fakes import (
    status,
)
from miles.utils.workers.reconcile.k8s_errors import (
    ConnectionFailure,
    KubernetesApiError,
    KubernetesConnectionError,
    exception_keeps_cursor,
    exception_rejects_cursor,
)


class _Coded(Exception):
    def __init__(self, **attributes: Any) -> None:
        super().__init__("coded")
        self.__dict__.update(attributes)


@pytest.mark.parametrize(
    ("exc", "rejects"),
    [
        (KubernetesApiError(410, "Expired"), True),
        (KubernetesApiError(504, "Timeout"), True),
        (KubernetesApiError(500, "Gone"), True),
        (KubernetesApiError(500, "InternalError"), False),
        (ApiException(status=410, reason="Expired: too old"), True),
        (ApiException(status=504), True),
        (ApiException(status=500, reason="Expired: too old"), True),
        (ApiException(status=500, reason="InternalError"), False),
        (_Coded(code=504), True),
        (_Coded(code=True), False),
        (_Coded(status="410"), False),
        (_Coded(body=json.dumps(status(500, "Gone"))), True),
        (_Coded(body="<html>"), False),
        (ConnectionResetError("reset"), False),
    ],
)
def test_exception_rejects_cursor_is_one_rule_for_every_shape(
    exc: BaseException, rejects: bool
) -> None:
    assert exception_rejects_cursor(exc) is rejects


@pytest.mark.parametrize(
    ("exc", "keeps"),
    [
        (KubernetesApiError(429, "TooManyRequests"), True),
        (ApiException(status=429), True),
        (KubernetesConnectionError("x", refused=True), True),
        (ConnectionRefusedError(111, "refused"), True),
        (KubernetesApiError(500, "InternalError"), False),
        (KubernetesConnectionError("cut short"), False),
        (KubernetesApiError(410, "Expired"), False),
    ],
)
def test_exception_keeps_cursor_is_gos_is_watch_error_retriable(
    exc: BaseException, keeps: bool
) -> None:
    assert exception_keeps_cursor(exc) is keeps


def test_a_refusal_wrapped_in_another_exception_keeps_the_cursor() -> None:
    wrapped = RuntimeError("watch failed")
    wrapped.__cause__ = OSError(errno.ECONNREFUSED, "Connect call failed")
    assert exception_keeps_cursor(wrapped)
    assert not exception_keeps_cursor(RuntimeError("watch failed"))


def test_the_connection_errors_old_shorthands_still_name_their_kind() -> None:
    assert KubernetesConnectionError("x", refused=True).kind is ConnectionFailure.REFUSED
    assert KubernetesConnectionError("x", idle=True).kind is ConnectionFailure.IDLE
    broken = KubernetesConnectionError("x")
    assert (broken.kind, broken.refused, broken.idle, broken.server) == (
        ConnectionFailure.BROKEN,
        False,
        False,
        None,
    )
