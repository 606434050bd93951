"""One HTTP exchange with the apiserver, bytes in and out: what the write client (``client/``)
sends its requests through. Go: client-go ``rest.HTTPClient`` (the ``http.Client`` under a
``RESTClient``).

``k8s_http2.Http2Transport`` is the real one (HTTP/2, or ``k8s_http.HttpTransport`` where ALPN
does not pick it; ``k8s_api.write_transport`` opens it, or ``k8s_api.KubernetesAsyncioTransport``
where a proxy applies); fast tests give the client a fake.
Importing this module imports no transport.
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


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One request to the apiserver at ``path`` (``/api/v1/...``), its query, body and the body's
    type; ``deadline`` bounds all of it in seconds, connecting included. Go: ``http.Request``."""

    method: str
    path: str
    query: Sequence[tuple[str, str]] = ()
    body: bytes | None = None
    content_type: str | None = None
    deadline: float | None = None


class Transport(Protocol):
    async def send(self, request: Request) -> RawResponse:
        """One exchange: ``request`` sent, its answer read whole. Go: ``RoundTripper``."""
        ...
