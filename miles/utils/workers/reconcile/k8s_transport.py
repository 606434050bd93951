"""One HTTP exchange with the apiserver, bytes in and out: what the write client (``client/``)
sends its requests through. Go: client-go ``rest.HTTPClient`` (the ``http.Client`` under a
``RESTClient``).

``k8s_api.KubernetesAsyncioTransport`` is the real one (the ``ApiClient``'s session, credentials
and TLS); fast tests give the client a fake. Importing this module imports no transport.
A transport raises ``KubernetesConnectionError`` for a failure below HTTP and returns every HTTP
answer, whatever its status.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class RawResponse:
    """An HTTP answer: its status, headers (names lowercased) and whole body."""

    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)


class Transport(Protocol):
    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: bytes | None = None,
        content_type: str | None = None,
        deadline: float | None = None,
    ) -> RawResponse:
        """One request to the apiserver at ``path`` (``/api/v1/...``); ``deadline`` bounds all
        of it in seconds, connecting included."""
        ...
