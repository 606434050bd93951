"""Small blocking HTTP(S) calls for readiness probes and the etcd JSON gateway."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

_TIMEOUT = 5.0


def tls_context(ca_cert: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_cert))


def get_status(
    url: str, *, token: str | None = None, context: ssl.SSLContext | None = None
) -> int | None:
    """The HTTP status of GET `url`, or None when nothing answers."""
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT, context=context) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code
    except (OSError, ssl.SSLError):
        return None


def post_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=_TIMEOUT) as response:
        result: dict[str, Any] = json.load(response)
        return result
