"""A stand-in ``Transport`` under the real write client: it records every request and a subclass
says what each is answered with. Go: a ``rest.HTTPClient`` whose round tripper is a test's."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from miles.utils.workers.reconcile.client import RawResponse, Request


@dataclass(frozen=True)
class Sent:
    """One request as the transport received it, its body decoded from JSON."""

    method: str
    path: str
    query: list[tuple[str, str]]
    body: Any
    content_type: str | None


@dataclass
class RecordingTransport:
    """Records each request in ``sent`` and returns ``answer(sent)``, or raises it when it is an
    exception. The client always bounds a request, so one without a deadline fails the test."""

    sent: list[Sent] = field(default_factory=list, kw_only=True)

    async def send(self, request: Request) -> RawResponse:
        assert request.deadline is not None
        body = request.body
        sent = Sent(
            request.method,
            request.path,
            list(request.query),
            None if body is None else json.loads(body),
            request.content_type,
        )
        self.sent.append(sent)
        answer = self.answer(sent)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def answer(self, sent: Sent) -> RawResponse | Exception:
        raise NotImplementedError
