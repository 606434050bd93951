"""Named health checks served as ``/healthz`` and ``/readyz``. Go: CR ``pkg/healthz`` (``Handler``).

A check returns ``None`` when healthy, or why not. The aggregated path answers 200 ``ok`` when
every check passes; otherwise, or with ``?verbose``, one ``[+]name ok`` / ``[-]name failed:
reason withheld`` line per check, sorted by name, and a last line. ``?exclude=name`` (repeatable)
skips a check. ``/<endpoint>/<name>`` runs that check alone and, as Go's ``CheckHandler``, shows its
reason on failure. No check at all serves Go's default ``ping``.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Callable, Mapping
from http import HTTPStatus

from miles.utils.workers.reconcile.manager.http_server import Request, Response, not_found, text

logger = logging.getLogger(__name__)

Checker = Callable[[], str | None]
PING = "ping"


def ping() -> str | None:
    """Go's ``healthz.Ping``: healthy whenever asked."""
    return None


class HealthChecks:
    """The checks of one endpoint (``/healthz`` or ``/readyz``), by name."""

    def __init__(self, endpoint: str, checks: Mapping[str, Checker] | None = None) -> None:
        if not endpoint.startswith("/") or endpoint.endswith("/"):
            raise ValueError(f"endpoint must look like '/healthz', got {endpoint!r}")
        self.endpoint = endpoint
        self._checks: dict[str, Checker] = {}
        for name, check in (checks or {}).items():
            self.add(name, check)

    def add(self, name: str, check: Checker) -> None:
        """Go: ``Manager.AddHealthzCheck`` / ``AddReadyzCheck``; a name is unique per endpoint."""
        if not name or name in self._checks:
            raise ValueError(f"{self.endpoint}: check name {name!r} is empty or already taken")
        self._checks[name] = check

    def serves(self, path: str) -> bool:
        return path == self.endpoint or path.startswith(self.endpoint + "/")

    def failures(self) -> dict[str, str]:
        """Every failing check's reason, by name."""
        found = {name: self._run(name, check) for name, check in self._checks.items()}
        return {name: reason for name, reason in found.items() if reason is not None}

    def serve(self, request: Request) -> Response:
        """Go: ``http.StripPrefix(endpoint, handler)`` then ``Handler.ServeHTTP``."""
        sub = posixpath.normpath("/" + request.path.removeprefix(self.endpoint).lstrip("/"))
        if sub == "/":
            return self._aggregated(request.query)
        name = sub[1:]
        check = self._served().get(name)
        if check is None:
            return not_found()
        return _single(self._run(name, check))

    def _served(self) -> Mapping[str, Checker]:
        return self._checks or {PING: ping}

    def _aggregated(self, query: Mapping[str, list[str]]) -> Response:
        excluded = set(query.get("exclude", ()))
        lines, failed, checks = [], False, self._served()
        for name in sorted(checks):
            if name in excluded:
                excluded.discard(name)
                lines.append(f"[+]{name} excluded: ok")
            elif self._run(name, checks[name]) is None:
                lines.append(f"[+]{name} ok")
            else:
                lines.append(f"[-]{name} failed: reason withheld")
                failed = True
        if not failed and "verbose" not in query:
            return text(HTTPStatus.OK, "ok")
        if excluded:
            names = ",".join(f'"{name}"' for name in sorted(excluded))
            lines.append(f"warn: some health checks cannot be excluded: no matches for {names}")
        lines.append("healthz check failed" if failed else "healthz check passed")
        status = HTTPStatus.INTERNAL_SERVER_ERROR if failed else HTTPStatus.OK
        return text(status, "\n".join(lines) + "\n")

    def _run(self, name: str, check: Checker) -> str | None:
        try:
            reason = check()
        except Exception as exc:
            reason = f"the check raised {exc!r}"
        if reason is not None:
            logger.debug("%s check %r failed: %s", self.endpoint, name, reason)
        return reason


def _single(reason: str | None) -> Response:
    """Go: ``CheckHandler.ServeHTTP``, whose failure is ``http.Error``'s body."""
    if reason is None:
        return text(HTTPStatus.OK, "ok")
    return text(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal server error: {reason}\n")
