"""What went wrong talking to a pod API, and what the reflector should do about it.
Go: apimachinery ``pkg/api/errors`` (``apierrors``) plus ``utilnet.IsConnectionRefused``.

The errors are our own, whatever the transport: ``KubernetesApiError`` (a non-2xx answer),
``KubernetesConnectionError`` (below HTTP, with its ``ConnectionFailure`` kind and the server's
address), ``KubernetesConfigError`` (a configuration the client cannot load) and
``FrameDecodeError`` (bytes that do not decode). ``k8s_api`` translates its client's exceptions
into them where they arise, so nothing else needs to know the client's.

Two rules classify a failed LIST or WATCH for the reflector, whoever raised it:
``exception_rejects_cursor`` (only a relist recovers; Go's ``isExpiredError`` and
``isTooLargeResourceVersionError``) and ``exception_keeps_cursor`` (the server is throttling or
unreachable: retry from the same cursor; Go's ``isWatchErrorRetriable``).
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

from pydantic import ValidationError

from miles.utils.workers.reconcile.k8s_types import WatchFrame
from miles.utils.workers.reconcile.log import one_line

CURSOR_REJECTED_CODES = frozenset({410, 504})
"""410 Expired/Gone, and 504 (reason Timeout, cause ResourceVersionTooLarge): a resourceVersion
beyond the server's history, answered on a LIST that carries it and on a ``sendInitialEvents``
watch (a plain watch from it waits silently instead)."""
CURSOR_REJECTED_REASONS = frozenset({"Expired", "Gone"})
"""Status reasons of a dead cursor, as apimachinery's ``IsResourceExpired`` / ``IsGone`` read them:
they key on the reason, whatever the code."""
TOO_MANY_REQUESTS = 429


class FrameDecodeError(ValueError):
    """A LIST body, list item or watch line that cannot be read as what it claims to be.

    ``reason`` says why, without the offending bytes. ``name``, ``resource_version`` and
    ``event_type`` are read from the frame when its envelope allows: a well-formed pod frame (type
    ADDED/MODIFIED/DELETED, in ``event_type``, and a readable ``metadata.resourceVersion``) whose
    pod does not validate has both; a frame whose envelope cannot be read has neither. Either
    way the frame is unreadable: a watcher ends the watch and relists.
    """

    def __init__(
        self,
        reason: str,
        *,
        name: str | None = None,
        resource_version: str | None = None,
        event_type: str | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.name = name
        self.resource_version = resource_version
        self.event_type = event_type


@dataclass(frozen=True, slots=True)
class StatusCause:
    """One entry of a Status's ``details.causes``: which field (``.spec.x``, ``metadata.name``), the
    cause's ``type`` (``FieldValueInvalid``, ``FieldManagerConflict``, ...) and its message.
    Go: ``metav1.StatusCause``."""

    field: str = ""
    type: str = ""
    message: str = ""

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class KubernetesApiError(Exception):
    """A request answered with a non-2xx HTTP status (the body's Status when readable).

    ``retry_after`` is the response's ``Retry-After`` in seconds, when it gave one in that form;
    ``causes`` the Status's ``details.causes``. A write's answer is raised as the subclass its
    reason names (``NotFoundError``, ``AlreadyExistsError``, ``ConflictError``, ``InvalidError``,
    ``ForbiddenError``; ``api_error`` picks it), each still a ``KubernetesApiError``.
    """

    def __init__(
        self,
        code: int,
        reason: str,
        message: str = "",
        *,
        retry_after: float | None = None,
        causes: tuple[StatusCause, ...] = (),
    ) -> None:
        super().__init__(f"HTTP {code} {reason}: {message}" if message else f"HTTP {code} {reason}")
        self.code = code
        self.reason = reason
        self.message = message
        self.retry_after = retry_after
        self.causes = causes

    @property
    def rejects_cursor(self) -> bool:
        return status_rejects_cursor(self.code, self.reason)


class NotFoundError(KubernetesApiError):
    """404, reason ``NotFound``. Go: ``apierrors.IsNotFound``."""


class AlreadyExistsError(KubernetesApiError):
    """409, reason ``AlreadyExists``: a create of a name that is taken. Go:
    ``apierrors.IsAlreadyExists``."""


class ConflictError(KubernetesApiError):
    """409, reason ``Conflict``: a stale resourceVersion, a failed JSON-patch ``test``, or an apply
    whose fields another manager owns (``causes`` name them). Go: ``apierrors.IsConflict``."""


class InvalidError(KubernetesApiError):
    """422, reason ``Invalid``: the object does not validate (``causes`` name the fields). Go:
    ``apierrors.IsInvalid``."""


class ForbiddenError(KubernetesApiError):
    """403, reason ``Forbidden``: authorization or an admission webhook refused it. Go:
    ``apierrors.IsForbidden``."""


_BY_REASON: dict[str, type[KubernetesApiError]] = {
    "NotFound": NotFoundError,
    "AlreadyExists": AlreadyExistsError,
    "Conflict": ConflictError,
    "Invalid": InvalidError,
    "Forbidden": ForbiddenError,
}
# A Status with no recognised reason is read by its code, as apimachinery's reasonAndCodeForError
# does (IsAlreadyExists keys on the reason alone: a bare 409 is a Conflict).
_BY_CODE: dict[int, type[KubernetesApiError]] = {
    404: NotFoundError,
    409: ConflictError,
    422: InvalidError,
    403: ForbiddenError,
}


def api_error(
    code: int,
    reason: str,
    message: str = "",
    *,
    retry_after: float | None = None,
    causes: tuple[StatusCause, ...] = (),
) -> KubernetesApiError:
    """The ``KubernetesApiError`` subclass a Status's reason (or, for an unknown reason, its code)
    names; ``KubernetesApiError`` itself for any other."""
    cls = _BY_REASON.get(reason) or _BY_CODE.get(code, KubernetesApiError)
    return cls(code, reason, message, retry_after=retry_after, causes=causes)


def is_not_found(exc: BaseException) -> bool:
    return isinstance(exc, NotFoundError) or _reason_or_code(exc, "NotFound", 404)


def is_already_exists(exc: BaseException) -> bool:
    return isinstance(exc, AlreadyExistsError) or (
        isinstance(exc, KubernetesApiError) and exc.reason == "AlreadyExists"
    )


def is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, ConflictError) or _reason_or_code(exc, "Conflict", 409)


def is_invalid(exc: BaseException) -> bool:
    return isinstance(exc, InvalidError) or _reason_or_code(exc, "Invalid", 422)


def is_forbidden(exc: BaseException) -> bool:
    return isinstance(exc, ForbiddenError) or _reason_or_code(exc, "Forbidden", 403)


def _reason_or_code(exc: BaseException, reason: str, code: int) -> bool:
    if not isinstance(exc, KubernetesApiError):
        return False
    if exc.reason in _BY_REASON:
        return exc.reason == reason
    return exc.code == code


class ConnectionFailure(StrEnum):
    """What broke below HTTP, as much as a person needs to act on it."""

    REFUSED = "refused"
    """Nothing listens at the address (``ECONNREFUSED``)."""
    UNREACHABLE = "unreachable"
    """The connection could not be made for another reason (no route, a name that resolves to
    nothing, ...)."""
    TLS_VERIFICATION = "tls-verification"
    """The server's certificate did not verify against the configured certificate authority."""
    TLS_HANDSHAKE = "tls-handshake"
    """The TLS handshake failed otherwise (a plain-HTTP port, a bad client certificate, ...)."""
    TIMEOUT = "timeout"
    """A client deadline ended the request."""
    IDLE = "idle"
    """A watch delivered no byte within its read-idle deadline."""
    STALLED = "stalled"
    """A watch delivered nothing while the apiserver, asked on another connection, had an event for
    it: its connection is dead though still open."""
    BROKEN = "broken"
    """The connection broke, was cut mid-body, or its response was malformed."""


class KubernetesConnectionError(ConnectionError):
    """A LIST or WATCH that failed below HTTP: the connection was refused (``refused``), could not
    be made, broke, was cut mid-body, went silent past its read deadline (``idle``), or stayed
    silent while the apiserver had an event for it (``stalled``).

    ``kind`` says which (``refused=True`` and ``idle=True`` are shorthands for its two values the
    reflector reads); ``server`` is the ``host:port`` it was talking to when the transport knows
    it, and ``reason`` the underlying failure's own text (the TLS library's verification message,
    the socket's ``strerror``), without the request's name. Go: ``net.OpError``, ``url.Error``.
    """

    def __init__(
        self,
        message: str,
        *,
        refused: bool = False,
        idle: bool = False,
        kind: ConnectionFailure | None = None,
        server: str | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        if kind is None:
            kind = (
                ConnectionFailure.REFUSED
                if refused
                else ConnectionFailure.IDLE
                if idle
                else ConnectionFailure.BROKEN
            )
        self.kind = kind
        self.server = server
        self.reason = reason
        self.refused = kind is ConnectionFailure.REFUSED
        self.idle = kind is ConnectionFailure.IDLE


class KubernetesConfigError(Exception):
    """A kubeconfig or an in-cluster configuration the client could not load or use.
    Go: ``clientcmd``'s and ``rest.InClusterConfig``'s errors."""


class InClusterConfigError(KubernetesConfigError):
    """The in-cluster configuration is incomplete; the message is one line naming what."""


def status_rejects_cursor(code: int | None, reason: str | None) -> bool:
    """Whether a Status with this code and reason means the cursor is dead."""
    return code in CURSOR_REJECTED_CODES or reason in CURSOR_REJECTED_REASONS


def exception_rejects_cursor(exc: BaseException) -> bool:
    """Whether a LIST or WATCH failure means the cursor is dead and only a relist recovers.

    True for our ``KubernetesApiError`` with code 410 or 504; for any exception carrying an int
    ``status`` or ``code`` of 410 or 504 (``kubernetes_asyncio``'s and the official client's
    ``ApiException``); and for a Status reason ``Expired`` or ``Gone``, read from ``reason`` (also
    in ``kubernetes_asyncio``'s ``"Expired: message"`` form) or from a JSON Status ``body``, as
    apimachinery's ``IsResourceExpired`` and ``IsGone`` key on the reason.
    """
    if isinstance(exc, KubernetesApiError):
        return exc.rejects_cursor
    if any(code in CURSOR_REJECTED_CODES for code in _int_attributes(exc, "status", "code")):
        return True
    return _status_reason(exc) in CURSOR_REJECTED_REASONS


def exception_keeps_cursor(exc: BaseException) -> bool:
    """Whether a WATCH failure is one to retry from the same cursor after a backoff step: HTTP 429,
    or a connection refused anywhere in the exception's chain. Go: ``isWatchErrorRetriable``
    (``utilnet.IsConnectionRefused`` or ``apierrors.IsTooManyRequests``)."""
    if TOO_MANY_REQUESTS in _int_attributes(exc, "status", "code"):
        return True
    if _status_reason(exc) == "TooManyRequests":
        return True
    return exception_is_refused(exc)


def exception_is_refused(exc: BaseException) -> bool:
    """Whether the server refused the connection (nothing listening), anywhere in the chain."""
    return any(_is_refused(link) for link in _chain(exc))


def exception_retry_after(exc: BaseException) -> float | None:
    """The seconds a failure asked the client to wait (``Retry-After``), if it said so."""
    if isinstance(exc, KubernetesApiError):
        return exc.retry_after
    headers = getattr(exc, "headers", None)
    getter = getattr(headers, "get", None)
    return parse_retry_after(getter("Retry-After") if callable(getter) else None)


exception_summary = one_line
"""``log.one_line``, under the name the adapter's modules and their callers import."""


def parse_retry_after(value: object) -> float | None:
    """A ``Retry-After`` header's delay in seconds; ``None`` for an absent, negative or HTTP-date
    value (the apiserver sends whole seconds)."""
    if not isinstance(value, str):
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if 0 <= seconds < float("inf") else None


def _int_attributes(exc: BaseException, *names: str) -> list[int]:
    values = (getattr(exc, name, None) for name in names)
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _status_reason(exc: BaseException) -> str | None:
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str) and reason:
        return reason.split(":", 1)[0].strip()
    body = getattr(exc, "body", None)
    if isinstance(body, str | bytes) and body:
        try:
            return WatchFrame.model_validate_json(body).reason
        except ValidationError:
            return None
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


def _is_refused(exc: BaseException) -> bool:
    if isinstance(exc, KubernetesConnectionError):
        return exc.refused
    return isinstance(exc, ConnectionRefusedError) or (
        isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED
    )
