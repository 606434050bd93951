"""Writes (and reads) of one object of any kind: create, get, replace, patch, apply, delete.
Go: controller-runtime ``pkg/client`` (``Client``, typed and unstructured) over client-go ``rest``.

``Client`` is given a ``Transport`` (``k8s_api.write_transport`` opens one in a process; a fake in
fast tests) and builds every request path from a ``resource.Resource``. It takes a pydantic
model (written by alias, camelCase, without ``None`` fields) or a mapping, and answers with the
type it was given: the model's class, or a ``dict`` (``into=`` picks the class where nothing is
given, on ``get``, ``patch`` and ``delete``).

A non-2xx answer raises the runtime's ``KubernetesApiError`` as the subclass its reason names
(``NotFoundError``, ``AlreadyExistsError``, ``ConflictError``, ``InvalidError``,
``ForbiddenError``, with ``code``, ``reason``, ``message``, ``causes`` and ``retry_after``); a
failure below HTTP raises ``KubernetesConnectionError``. ``request_retry`` says which are sent
again. Every failure is one log line naming the verb, the kind, ``namespace/name`` and the reason.
"""

from __future__ import annotations

import http
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

from pydantic import BaseModel

from miles.utils.workers.reconcile.arguments import positive_finite
from miles.utils.workers.reconcile.client.encoding import Body, decode, encode, request_wire
from miles.utils.workers.reconcile.client.patches import (
    APPLY_PATCH,
    BUILT_IN_GROUPS,
    JsonPatch,
    Patch,
    StrategicMergePatch,
)
from miles.utils.workers.reconcile.client.request_retry import MAX_RETRIES, retry_delay
from miles.utils.workers.reconcile.clock import Clock, RealClock
from miles.utils.workers.reconcile.k8s_errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidError,
    KubernetesApiError,
    KubernetesConnectionError,
    NotFoundError,
    StatusCause,
    api_error,
    exception_summary,
    parse_retry_after,
)
from miles.utils.workers.reconcile.k8s_transport import RawResponse, Request, Transport
from miles.utils.workers.reconcile.resource import Resource

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

FIELD_MANAGER_MAX_LENGTH = 128
"""Go: apimachinery ``validation.FieldManagerMaxLength``."""
REQUEST_TIMEOUT = 30.0
PropagationPolicy = Literal["Orphan", "Background", "Foreground"]
WriteObserver = Callable[[Resource, str], None]
"""Told the resource and the resourceVersion of every write the apiserver answered with an
object (read your own writes: ``own_writes.OwnWrites.observer``)."""
_EXPECTED = (NotFoundError, AlreadyExistsError, ConflictError)
"""Answers a controller reads as outcomes (gone, there already, changed since read): logged at
INFO, every other failure at WARNING."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Preconditions:
    """A delete happens only to this object: the ``uid`` (not a later one of the same name) and,
    when given, this ``resource_version``. Go: ``metav1.Preconditions``."""

    uid: str | None = None
    resource_version: str | None = None

    def wire(self) -> dict[str, str]:
        fields = {"uid": self.uid, "resourceVersion": self.resource_version}
        return {k: v for k, v in fields.items() if v is not None}


@dataclass(frozen=True, slots=True)
class _Target:
    resource: Resource
    namespace: str | None
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    def path(self, *, subresource: str = "", collection: bool = False) -> str:
        name = None if collection else self.name
        return self.resource.path(namespace=self.namespace, name=name, subresource=subresource)


class Client:
    """One apiserver's writes, any kind. Go: controller-runtime ``client.Client``.

    ``field_manager`` names this writer in ``managedFields`` on every write (controller-runtime's
    ``WithFieldOwner``) and is the default manager of ``apply``; ``request_timeout`` bounds each
    request, connecting included; ``clock`` times the waits between retries.
    """

    def __init__(
        self,
        *,
        transport: Transport,
        field_manager: str | None = None,
        request_timeout: float = REQUEST_TIMEOUT,
        clock: Clock | None = None,
        on_write: WriteObserver | None = None,
    ) -> None:
        self._transport = transport
        self._on_write = on_write
        self._field_manager = None if field_manager is None else _manager(field_manager)
        self._manager_query = () if field_manager is None else (("fieldManager", field_manager),)
        self._timeout = positive_finite("request_timeout", request_timeout)
        self._clock = clock or RealClock()

    # --- reads --------------------------------------------------------------------------------

    @overload
    async def get(
        self, resource: Resource, name: str, *, namespace: str | None = ..., into: type[M]
    ) -> M: ...
    @overload
    async def get(
        self, resource: Resource, name: str, *, namespace: str | None = ..., into: None = ...
    ) -> dict[str, Any]: ...
    async def get(
        self,
        resource: Resource,
        name: str,
        *,
        namespace: str | None = None,
        into: type[M] | None = None,
    ) -> M | dict[str, Any]:
        """The object as the apiserver has it now (a quorum read)."""
        target = _target(resource, namespace, name)
        body = await self._call("get", "GET", target, target.path())
        return decode(body, into, f"get {resource.kind} {target}")  # type: ignore[no-any-return]

    # --- writes -------------------------------------------------------------------------------

    @overload
    async def create(self, resource: Resource, obj: M, *, namespace: str | None = ...) -> M: ...
    @overload
    async def create(
        self, resource: Resource, obj: Mapping[str, Any], *, namespace: str | None = ...
    ) -> dict[str, Any]: ...
    async def create(
        self, resource: Resource, obj: Body, *, namespace: str | None = None
    ) -> BaseModel | dict[str, Any]:
        """POST ``obj`` (named by ``metadata.name`` or ``generateName``). Go: ``Client.Create``."""
        wire = _typed(resource, request_wire(obj))
        target = _target(resource, _namespace_of(resource, namespace, wire), _name_to_create(wire))
        path = target.path(collection=True)
        body = await self._call("create", "POST", target, path, body=encode(wire))
        what = f"create {resource.kind} {target}"
        return self._answer(body, _into(obj), what, resource)  # type: ignore[no-any-return]

    @overload
    async def replace(
        self, resource: Resource, obj: M, *, namespace: str | None = ..., subresource: str = ...
    ) -> M: ...
    @overload
    async def replace(
        self,
        resource: Resource,
        obj: Mapping[str, Any],
        *,
        namespace: str | None = ...,
        subresource: str = ...,
    ) -> dict[str, Any]: ...
    async def replace(
        self, resource: Resource, obj: Body, *, namespace: str | None = None, subresource: str = ""
    ) -> BaseModel | dict[str, Any]:
        """PUT ``obj`` whole (``subresource="status"``: its status), guarded by the
        ``metadata.resourceVersion`` it carries: a ``ConflictError`` if the object changed since.
        An object without one is refused here, as an unguarded update would overwrite whatever
        was written since it was read. Go: ``Client.Update``, ``Client.Status().Update``."""
        wire = _typed(resource, request_wire(obj))
        metadata = _metadata(wire)
        target = _target(resource, _namespace_of(resource, namespace, wire), metadata.get("name"))
        if not metadata.get("resourceVersion"):
            raise ValueError(
                f"replace {resource.kind} {target}: metadata.resourceVersion is not set; a replace "
                "is guarded by the resourceVersion the object was read at (use a patch or apply)"
            )
        path = target.path(subresource=subresource)
        verb = _verb("update", subresource)
        body = await self._call(verb, "PUT", target, path, body=encode(wire))
        what = f"{verb} {resource.kind} {target}"
        return self._answer(body, _into(obj), what, resource)  # type: ignore[no-any-return]

    @overload
    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Patch,
        *,
        namespace: str | None = ...,
        subresource: str = ...,
        into: type[M],
    ) -> M: ...
    @overload
    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Patch,
        *,
        namespace: str | None = ...,
        subresource: str = ...,
        into: None = ...,
    ) -> dict[str, Any]: ...
    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Patch,
        *,
        namespace: str | None = None,
        subresource: str = "",
        into: type[M] | None = None,
    ) -> M | dict[str, Any]:
        """PATCH the object (``subresource="status"``: its status) with a ``MergePatch``,
        ``JsonPatch`` or ``StrategicMergePatch``; a strategic merge patch of a custom resource is
        refused here (``ValueError``): only built-in kinds declare its merge keys. Go:
        ``Client.Patch``."""
        target = _target(resource, namespace, name)
        if isinstance(patch, StrategicMergePatch) and resource.group not in BUILT_IN_GROUPS:
            raise ValueError(
                f"patch {resource.kind} {target}: a strategic merge patch needs a built-in kind; "
                f"{resource.group_resource} is a custom resource (use a merge or JSON patch)"
            )
        verb = _verb("patch", subresource)
        guard = patch.guard if isinstance(patch, JsonPatch) else None
        body = await self._call(
            verb,
            "PATCH",
            target,
            target.path(subresource=subresource),
            body=encode(patch.wire()),
            content_type=patch.content_type,
            reread=None if guard is None else _guard_failed(guard),
        )
        what = f"{verb} {resource.kind} {target}"
        return self._answer(body, into, what, resource)  # type: ignore[no-any-return]

    @overload
    async def apply(
        self,
        resource: Resource,
        obj: M,
        *,
        field_manager: str | None = ...,
        force: bool = ...,
        namespace: str | None = ...,
        subresource: str = ...,
    ) -> M: ...
    @overload
    async def apply(
        self,
        resource: Resource,
        obj: Mapping[str, Any],
        *,
        field_manager: str | None = ...,
        force: bool = ...,
        namespace: str | None = ...,
        subresource: str = ...,
    ) -> dict[str, Any]: ...
    async def apply(
        self,
        resource: Resource,
        obj: Body,
        *,
        field_manager: str | None = None,
        force: bool = False,
        namespace: str | None = None,
        subresource: str = "",
    ) -> BaseModel | dict[str, Any]:
        """Server-side apply: ``obj`` states the fields ``field_manager`` (or the client's) owns;
        ``force`` takes fields another manager owns instead of failing with a ``ConflictError``
        whose ``causes`` name them. Only the fields set on a model are sent. An object carrying
        ``managedFields`` is refused, as client-go's dynamic client refuses it. Go:
        ``Client.Apply`` with ``FieldOwner`` and ``ForceOwnership``."""
        manager = _manager(field_manager) if field_manager is not None else self._field_manager
        wire = _typed(resource, request_wire(obj, only_set=True))
        metadata = _metadata(wire)
        target = _target(resource, _namespace_of(resource, namespace, wire), metadata.get("name"))
        if manager is None:
            raise ValueError(f"apply {resource.kind} {target}: a field manager is required")
        if metadata.get("managedFields"):
            raise ValueError(
                f"apply {resource.kind} {target}: the object carries metadata.managedFields; "
                "apply states the fields wanted, not an object read back (leave managedFields out)"
            )
        query = (
            (("fieldManager", manager), ("force", "true"))
            if force
            else (("fieldManager", manager),)
        )
        verb = _verb("apply", subresource)
        body = await self._call(
            verb,
            "PATCH",
            target,
            target.path(subresource=subresource),
            query=query,
            body=encode(wire),
            content_type=APPLY_PATCH,
            with_manager=False,
        )
        what = f"{verb} {resource.kind} {target}"
        return self._answer(body, _into(obj), what, resource)  # type: ignore[no-any-return]

    async def delete(
        self,
        resource: Resource,
        name: str,
        *,
        namespace: str | None = None,
        preconditions: Preconditions | None = None,
        propagation_policy: PropagationPolicy | None = None,
        grace_period_seconds: int | None = None,
    ) -> dict[str, Any]:
        """DELETE the object, only if it still has ``preconditions``' uid and resourceVersion (a
        ``ConflictError`` otherwise). The answer is the object still being deleted (finalizers,
        a grace period) or a ``Status``. Go: ``Client.Delete`` with ``Preconditions``,
        ``PropagationPolicy`` and ``GracePeriodSeconds``."""
        target = _target(resource, namespace, name)
        if grace_period_seconds is not None and grace_period_seconds < 0:
            raise ValueError(f"delete {resource.kind} {target}: grace_period_seconds < 0")
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if preconditions is not None:
            options["preconditions"] = preconditions.wire()
        if propagation_policy is not None:
            options["propagationPolicy"] = propagation_policy
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        body = await self._call(
            "delete", "DELETE", target, target.path(), body=encode(options), with_manager=False
        )
        what = f"delete {resource.kind} {target}"
        return self._answer(body, None, what, resource)  # type: ignore[no-any-return]

    # --- the request --------------------------------------------------------------------------

    def _answer(self, body: bytes, into: type[M] | None, what: str, resource: Resource) -> Any:
        """A write's answer read as ``decode`` reads it, its resourceVersion told to ``on_write``
        from what was read once where it is a ``dict`` (a model's, from the bytes, before it is
        validated)."""
        if self._on_write is None:
            return decode(body, into, what)
        if into is not None:
            _observe_write(self._on_write, resource, body)
            return decode(body, into, what)
        answer = decode(body, None, what)
        _observe_answer(self._on_write, resource, answer)
        return answer

    async def _call(
        self,
        verb: str,
        method: str,
        target: _Target,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: bytes | None = None,
        content_type: str = "application/json",
        with_manager: bool = True,
        reread: Callable[[Exception], Exception] | None = None,
    ) -> bytes:
        """The answer's body of a 2xx; sends the request again as ``request_retry`` allows."""
        if with_manager and method != "GET":
            query = (*query, *self._manager_query)
        request = Request(
            method=method,
            path=path,
            query=query,
            body=body,
            content_type=content_type if body is not None else None,
            deadline=self._timeout,
        )
        retries = 0
        while True:
            try:
                response = await self._transport.send(request)
            except KubernetesConnectionError as err:
                failure: Exception = err
            else:
                if 200 <= response.status <= 299:
                    return response.body
                failure = status_error(response)
            delay = retry_delay(method, failure, retries)
            if delay is None:
                failure = failure if reread is None else reread(failure)
                _log_failure(verb, target, failure)
                raise failure
            retries += 1
            logger.info(
                "%s %s %s: %s; retry %d of %d in %gs",
                verb,
                target.resource.kind,
                target,
                _reason(failure),
                retries,
                MAX_RETRIES,
                delay,
            )
            await self._clock.sleep(delay)


def _observe_write(observer: WriteObserver, resource: Resource, body: bytes) -> None:
    try:
        answer = json.loads(body)
    except ValueError:
        return
    _observe_answer(observer, resource, answer)


def _observe_answer(observer: WriteObserver, resource: Resource, answer: Any) -> None:
    metadata = answer.get("metadata") if isinstance(answer, dict) else None
    version = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
    if isinstance(version, str) and version and answer.get("kind") != "Status":
        observer(resource, version)


def _guard_failed(resource_version: str) -> Callable[[Exception], Exception]:
    """A guarded JSON patch's 422 without causes read as the Conflict it is: the apiserver answers
    a failed ``test`` op with a bare 422 Invalid (no field, no cause), where a stale resourceVersion
    elsewhere is a 409. The code and reason stay the server's."""

    def reread(failure: Exception) -> Exception:
        if not isinstance(failure, InvalidError) or failure.causes:
            return failure
        return ConflictError(
            failure.code,
            failure.reason,
            f"the object changed since resourceVersion {resource_version} (the patch's test of "
            f"metadata.resourceVersion failed): {failure.message}",
            retry_after=failure.retry_after,
        )

    return reread


def status_error(response: RawResponse) -> KubernetesApiError:
    """A non-2xx answer as the ``KubernetesApiError`` its Status names (``api_error``); a body
    that is no Status gives the HTTP reason phrase and the body's first line."""
    retry_after = parse_retry_after(response.headers.get("retry-after"))
    try:
        status = json.loads(response.body)
    except ValueError:
        status = None
    if not isinstance(status, dict) or status.get("kind") != "Status":
        text = response.body.decode(errors="replace").strip()
        first_line = text.splitlines()[0] if text else ""
        return api_error(
            response.status, _phrase(response.status), first_line, retry_after=retry_after
        )
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    reason = status.get("reason")
    message = status.get("message")
    return api_error(
        response.status,
        reason if isinstance(reason, str) and reason else _phrase(response.status),
        message if isinstance(message, str) else "",
        retry_after=retry_after,
        causes=tuple(_cause(c) for c in causes if isinstance(c, dict))
        if isinstance(causes, list)
        else (),
    )


def _cause(cause: Mapping[str, Any]) -> StatusCause:
    def text(key: str) -> str:
        value = cause.get(key)
        return value if isinstance(value, str) else ""

    return StatusCause(field=text("field"), type=text("reason"), message=text("message"))


def _phrase(code: int) -> str:
    try:
        return http.HTTPStatus(code).phrase.replace(" ", "")
    except ValueError:
        return f"HTTP{code}"


def _log_failure(verb: str, target: _Target, failure: Exception) -> None:
    level = logging.INFO if isinstance(failure, _EXPECTED) else logging.WARNING
    logger.log(level, "%s %s %s failed: %s", verb, target.resource.kind, target, _reason(failure))


def _reason(failure: Exception) -> str:
    if isinstance(failure, KubernetesApiError):
        causes = "; ".join(str(c) for c in failure.causes)
        text = f"{failure.code} {failure.reason}: {failure.message}"
        return f"{text} ({causes})" if causes and causes not in failure.message else text
    return exception_summary(failure)


def _into(given: Body) -> type[BaseModel] | None:
    """The class an answer is read into: the model's given, or None (a ``dict``)."""
    return type(given) if type(given) is not dict and isinstance(given, BaseModel) else None


def _verb(verb: str, subresource: str) -> str:
    return f"{verb} {subresource}" if subresource else verb


def _manager(name: str) -> str:
    if not name or len(name) > FIELD_MANAGER_MAX_LENGTH:
        raise ValueError(
            f"field manager {name[:40]!r}... must be 1 to {FIELD_MANAGER_MAX_LENGTH} characters"
            if name
            else "a field manager must not be empty"
        )
    return name


def _metadata(wire: Mapping[str, Any]) -> dict[str, Any]:
    metadata = wire.get("metadata")
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise ValueError(f"metadata is a {type(metadata).__name__}, not an object")
    return metadata


def _typed(resource: Resource, wire: dict[str, Any]) -> dict[str, Any]:
    """``wire`` with ``resource``'s ``apiVersion`` and ``kind``, which it must not contradict."""
    for key, value in (("apiVersion", resource.api_version), ("kind", resource.kind)):
        given = wire.setdefault(key, value)
        if given != value:
            raise ValueError(f"the object's {key} is {given!r}; {resource} serves {value!r}")
    return wire


def _namespace_of(resource: Resource, namespace: str | None, wire: Mapping[str, Any]) -> str | None:
    stated = _metadata(wire).get("namespace")
    if namespace and stated and namespace != stated:
        raise ValueError(f"namespace {namespace!r} given for an object in namespace {stated!r}")
    return namespace or stated or None


def _name_to_create(wire: Mapping[str, Any]) -> str:
    metadata = _metadata(wire)
    name = metadata.get("name")
    generate = metadata.get("generateName")
    if not name and not generate:
        raise ValueError("create needs metadata.name or metadata.generateName")
    return str(name or f"{generate}*")


def _target(resource: Resource, namespace: str | None, name: object) -> _Target:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a {resource.kind} needs a name (metadata.name)")
    if resource.namespaced and not namespace:
        raise ValueError(f"{resource.kind} {name} is namespaced: a namespace is required")
    if not resource.namespaced and namespace:
        raise ValueError(f"{resource.kind} {name} is cluster-scoped: no namespace")
    return _Target(resource, namespace, name)
