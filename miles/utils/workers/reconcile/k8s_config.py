"""Where a client finds its apiserver and credentials. Go: client-go ``tools/clientcmd`` with
``rest.InClusterConfig``, in controller-runtime's ``pkg/client/config.GetConfig`` order.

Kubeconfig files are read as kubectl reads them (``ClientConfigLoadingRules``): ``--kubeconfig``
names one file, which must exist; otherwise every file of ``$KUBECONFIG`` that exists is merged, in
order: the first file to set ``current-context``, or a cluster, user or context of a given name,
wins, and entries are never merged field by field; without either, ``~/.kube/config``. Relative
paths inside a file are resolved against that file's folder. In a pod, the mounted service account
gives the server, the CA and a token re-read as client-go re-reads it (``ServiceAccountToken``).
``resolve_config`` picks one of the two; ``tls_failure_reason`` is the one reading of a TLS error.

Pure: files, the environment and ``ssl``. ``k8s_api`` turns a ``ClientConfig`` into the client
library's configuration and opens the session (``client_configuration``, ``kube_session``). Every
problem raises ``ConfigurationError``, whose message is the one line to show.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miles.utils.workers.reconcile.k8s_errors import InClusterConfigError, KubernetesConfigError

logger = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "default"
DEFAULT_KUBECONFIG = Path("~/.kube/config")
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where a pod's service account is mounted: ``token``, ``ca.crt`` and ``namespace``."""
SERVICE_HOST, SERVICE_PORT = "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"
TOKEN_CACHE_SECONDS = 50.0
"""How long a token read from its file is used before the file is read again: client-go's
``NewCachedFileTokenSource`` (a minute, less its 10 s leeway)."""
NAMED_SECTIONS = {"clusters": "cluster", "users": "user", "contexts": "context"}
PATH_FIELDS = {
    "cluster": ("certificate-authority",),
    "user": ("client-certificate", "client-key", "tokenFile"),
}
DATA_FIELDS = {"cluster": ("certificate-authority",), "user": ("client-certificate", "client-key")}


class ConfigurationError(KubernetesConfigError):
    """No usable configuration; the message is one line naming where it looked and what is
    wrong."""


class KubeconfigError(ConfigurationError):
    """A kubeconfig that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeTarget:
    """What the user asked for: ``--kubeconfig``, ``--context`` and ``-n`` (each may be unset).
    Go: ``clientcmd.ConfigOverrides`` with the loading rules' ``ExplicitPath``."""

    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None


@dataclass(frozen=True, slots=True)
class KubeconfigSource:
    """Where the kubeconfig came from, for error lines: the files and the flag or variable."""

    paths: tuple[Path, ...]
    origin: str

    @property
    def shown(self) -> str:
        return os.pathsep.join(str(p) for p in self.paths)

    @property
    def hint(self) -> str:
        if self.origin == "--kubeconfig":
            return "fix it or pass another --kubeconfig"
        if self.origin == "$KUBECONFIG":
            return "fix it or point KUBECONFIG elsewhere"
        return "fix it or pass --kubeconfig"


@dataclass(frozen=True, slots=True)
class ResolvedContext:
    """The context kubectl would use: its name, and a single-context kubeconfig holding only it,
    its cluster and its user, every path absolute."""

    source: KubeconfigSource
    context: str
    namespace: str | None
    server: str
    config: dict[str, Any]


class ServiceAccountToken:
    """The bearer token from a mounted file, as a ``Configuration.refresh_api_key_hook``: read
    before the first request, again once ``TOKEN_CACHE_SECONDS`` have passed, and again before
    the next request after the apiserver refused one with 401 (``forget``). Go:
    ``transport.cachingTokenSource`` and ``tokenSourceTransport``'s ``ResetTokenOlderThan``.
    A file that cannot be read keeps the token last read, with one warning."""

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self._token: str | None = None
        self._read_at: float | None = None
        self._unreadable: str | None = None

    def __call__(self, configuration: Any) -> None:
        token = self.current()
        if token is not None:
            configuration.api_key["BearerToken"] = f"Bearer {token}"

    def current(self) -> str | None:
        """The token to send now, the file read first when the one held is stale; raises
        ``InClusterConfigError`` when no token was ever read."""
        now = self._clock()
        if self._read_at is None or now - self._read_at >= TOKEN_CACHE_SECONDS:
            self._read(now)
        return self._token

    def forget(self) -> None:
        """The next request reads the file first."""
        self._read_at = None

    def _read(self, now: float) -> None:
        try:
            token = self.path.read_text().strip()
        except OSError as err:
            if self._token is None:
                raise InClusterConfigError(f"cannot read the token {self.path}: {err}") from None
            problem = f"{err.strerror or err}"
            if problem != self._unreadable:
                logger.warning(
                    "cannot read the token %s (%s): keeping the one read before", self.path, problem
                )
            self._unreadable = problem
            return
        self._token, self._read_at, self._unreadable = token, now, None


@dataclass(frozen=True, slots=True, kw_only=True)
class InClusterConfig:
    """The service account's view of the apiserver. Go: ``rest.InClusterConfig``'s result."""

    server: str
    ca_file: Path
    token: ServiceAccountToken
    namespace: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientConfig:
    """A resolved configuration: the credentials (one kubeconfig context, or the service account)
    and the namespace to use. Go: ``rest.Config`` with ``clientcmd.ClientConfig.Namespace``."""

    credentials: ResolvedContext | InClusterConfig
    namespace: str

    @property
    def server(self) -> str:
        return self.credentials.server

    @property
    def context(self) -> str | None:
        """The kubeconfig context; ``None`` in cluster."""
        creds = self.credentials
        return creds.context if isinstance(creds, ResolvedContext) else None


def resolve_config(
    target: KubeTarget, environ: Mapping[str, str], service_account: Path = SERVICE_ACCOUNT
) -> ClientConfig:
    """controller-runtime's order (``config.GetConfig``): ``--kubeconfig``; else, unless
    ``KUBECONFIG`` is set (or ``--context`` names a kubeconfig context), the service account when
    in a pod; else ``KUBECONFIG`` or ``~/.kube/config``; else the service account, or one line
    naming every place looked in."""
    in_cluster_first = not (target.kubeconfig or target.context or environ.get("KUBECONFIG"))
    if in_cluster_first and in_cluster_possible(environ, service_account):
        return _in_cluster(target, environ, service_account)
    source = find_kubeconfig(target.kubeconfig, environ)
    if source is None:
        if not environ.get(SERVICE_HOST):
            raise ConfigurationError(
                "no Kubernetes configuration: no kubeconfig (--kubeconfig, $KUBECONFIG,"
                f" ~/.kube/config) and not in a pod ({SERVICE_HOST} unset,"
                f" no {service_account / 'token'})"
            )
        if target.context:
            raise ConfigurationError(f"--context {target.context}: no kubeconfig to find it in")
        return _in_cluster(target, environ, service_account)
    resolved = resolve_context(source, target.context)
    check_certificates(resolved)
    namespace = target.namespace or resolved.namespace or DEFAULT_NAMESPACE
    return ClientConfig(credentials=resolved, namespace=namespace)


def _in_cluster(
    target: KubeTarget, environ: Mapping[str, str], service_account: Path
) -> ClientConfig:
    try:
        found = in_cluster_config(environ, service_account)
    except InClusterConfigError as err:
        raise ConfigurationError(f"{err}; pass --kubeconfig when not running in a pod") from None
    namespace = target.namespace or found.namespace or DEFAULT_NAMESPACE
    return ClientConfig(credentials=found, namespace=namespace)


def in_cluster_possible(
    environ: Mapping[str, str], service_account: Path = SERVICE_ACCOUNT
) -> bool:
    """Go: clientcmd's ``inClusterClientConfig.Possible``: the service's host and port are set and
    the token file exists."""
    token = service_account / "token"
    return bool(environ.get(SERVICE_HOST)) and bool(environ.get(SERVICE_PORT)) and token.is_file()


def in_cluster_config(
    environ: Mapping[str, str], service_account: Path = SERVICE_ACCOUNT
) -> InClusterConfig:
    """The server from ``KUBERNETES_SERVICE_HOST``/``_PORT``, the CA, token and namespace from
    ``service_account``; the token is read once here, so a missing one fails now. Raises
    ``InClusterConfigError``, one line naming the folder. Go: ``rest.InClusterConfig``."""
    token = ServiceAccountToken(service_account / "token")
    ca_file = service_account / "ca.crt"
    try:
        server = _service_server(environ)
        if not token.path.is_file():
            raise InClusterConfigError("Service token file does not exist")
        if not token.current():
            raise InClusterConfigError("Token file exists but empty")
        if not ca_file.is_file():
            raise InClusterConfigError("Service certification file does not exist")
        if not ca_file.read_bytes():
            raise InClusterConfigError("Cert file exists but empty")
    except (OSError, InClusterConfigError) as err:
        raise InClusterConfigError(
            f"in-cluster configuration ({service_account}): {str(err).rstrip('.')}"
        ) from None
    namespace = _service_account_namespace(service_account)
    return InClusterConfig(server=server, ca_file=ca_file, token=token, namespace=namespace)


def _service_server(environ: Mapping[str, str]) -> str:
    if SERVICE_HOST not in environ or SERVICE_PORT not in environ:
        raise InClusterConfigError("Service host/port is not set")
    host, port = environ[SERVICE_HOST], environ[SERVICE_PORT]
    if not host or not port:
        raise InClusterConfigError("Service host/port is set but empty")
    # Go's net.JoinHostPort: an IPv6 address is bracketed.
    joined = f"[{host}]:{port}" if ":" in host or "%" in host else f"{host}:{port}"
    return f"https://{joined}"


def _service_account_namespace(service_account: Path) -> str | None:
    try:
        return (service_account / "namespace").read_text().strip() or None
    except OSError:
        return None


def find_kubeconfig(explicit: str | None, environ: Mapping[str, str]) -> KubeconfigSource | None:
    """The files to read: ``--kubeconfig``, then ``$KUBECONFIG``, then ``~/.kube/config``;
    ``None`` when there are none (the caller then tries in-cluster)."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.exists():
            raise KubeconfigError(
                f"kubeconfig {explicit} (from --kubeconfig): no such file; pass an existing file"
            )
        return KubeconfigSource((path,), "--kubeconfig")
    listed = [Path(p).expanduser() for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        existing = tuple(p for p in listed if p.exists())
        if not existing:
            raise KubeconfigError(
                f"kubeconfig {environ['KUBECONFIG']} (from $KUBECONFIG): no such file; "
                "point KUBECONFIG at an existing file or unset it"
            )
        return KubeconfigSource(existing, "$KUBECONFIG")
    default = DEFAULT_KUBECONFIG.expanduser()
    return KubeconfigSource((default,), "default") if default.exists() else None


def resolve_context(source: KubeconfigSource, context: str | None) -> ResolvedContext:
    """Merge ``source``'s files and pick ``context`` (default: the merged ``current-context``)."""
    files = [(path, read_kubeconfig(path, source)) for path in source.paths]
    if not any(config for _, config in files):
        raise KubeconfigError(f"kubeconfig {source.shown}: the file is empty; {source.hint}")
    merged = merge_kubeconfigs(files)
    name = context or merged["current-context"]
    if not name:
        raise KubeconfigError(
            f"kubeconfig {source.shown}: no current-context is set; pass --context NAME "
            "or run `kubectl config use-context NAME`"
        )
    chosen = merged["contexts"].get(name)
    if chosen is None:
        known = ", ".join(sorted(merged["contexts"])) or "none"
        raise KubeconfigError(
            f"kubeconfig {source.shown}: context {name!r} not found (contexts: {known}); "
            "pass --context with one of them"
        )
    body = _mapping(chosen[1].get("context"), chosen[0], f"context {name!r}")
    cluster_name, user_name = body.get("cluster"), body.get("user")
    cluster = _entry(merged, "clusters", cluster_name, chosen[0], name)
    user = _entry(merged, "users", user_name, chosen[0], name) if user_name else {}
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise KubeconfigError(
            f"kubeconfig {chosen[0]}: cluster {cluster_name!r} has no server; {source.hint}"
        )
    namespace = body.get("namespace")
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": name,
        "contexts": [{"name": name, "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
    }
    return ResolvedContext(
        source=source,
        context=name,
        namespace=namespace if isinstance(namespace, str) and namespace else None,
        server=server,
        config=config,
    )


def read_kubeconfig(path: Path, source: KubeconfigSource) -> dict[str, Any]:
    """One file parsed as a kubeconfig mapping; an empty file reads as an empty mapping, as
    kubectl reads it (one of several files in ``$KUBECONFIG`` may be empty)."""
    import yaml  # type: ignore[import-untyped]

    where = f"kubeconfig {path}"
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise KubeconfigError(f"{where}: is a directory, not a file; {source.hint}") from None
    except OSError as err:
        raise KubeconfigError(f"{where}: cannot read it ({err.strerror}); {source.hint}") from None
    if b"\x00" in data:
        raise KubeconfigError(f"{where}: binary data, not a kubeconfig; {source.hint}")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise KubeconfigError(f"{where}: not UTF-8 text, not a kubeconfig; {source.hint}") from None
    if not text.strip():
        return {}
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "unparseable"
        raise KubeconfigError(f"{where}: not YAML{at} ({problem}); {source.hint}") from None
    if parsed is None:
        return {}
    if not isinstance(parsed, dict):
        raise KubeconfigError(
            f"{where}: a YAML {type(parsed).__name__}, not a kubeconfig mapping; {source.hint}"
        )
    return _with_absolute_paths(parsed, path)


def merge_kubeconfigs(
    files: Sequence[tuple[Path, Mapping[str, Any]]],
) -> dict[str, Any]:
    """``clientcmd``'s merge: per section, the first file to name an entry owns it; the first
    non-empty ``current-context`` wins. Entries keep the file they came from."""
    merged: dict[str, Any] = {"current-context": "", **{s: {} for s in NAMED_SECTIONS}}
    for path, config in files:
        current = config.get("current-context")
        if not merged["current-context"] and isinstance(current, str):
            merged["current-context"] = current
        for section in NAMED_SECTIONS:
            entries = config.get(section) or []
            if not isinstance(entries, list):
                raise KubeconfigError(f"kubeconfig {path}: {section} is not a list")
            for entry in entries:
                name = entry.get("name") if isinstance(entry, dict) else None
                if not isinstance(name, str):
                    raise KubeconfigError(f"kubeconfig {path}: an entry of {section} has no name")
                merged[section].setdefault(name, (path, entry))
    return merged


def check_certificates(resolved: ResolvedContext) -> None:
    """Load the certificate data as the TLS client will, so bad data is named before connecting."""
    cluster = resolved.config["clusters"][0]["cluster"]
    user = resolved.config["users"][0]["user"]
    where = f"kubeconfig {resolved.source.shown}: context {resolved.context!r}"
    ca = _pem(cluster, "certificate-authority", where)
    if ca is not None:
        try:
            ssl.create_default_context(cadata=ca.decode(errors="replace"))
        except (ssl.SSLError, ValueError) as err:
            raise KubeconfigError(
                f"{where}: certificate-authority is not a usable certificate "
                f"({tls_failure_reason(err)})"
            ) from None
    cert = _pem(user, "client-certificate", where)
    key = _pem(user, "client-key", where)
    if cert is not None and key is not None:
        _check_key_pair(cert, key, where)


def with_data_in_files(resolved: ResolvedContext, folder: Path) -> dict[str, Any]:
    """``resolved``'s kubeconfig with each inline certificate or key (``*-data``) written to a file
    of its own in ``folder`` (mode 0600) and named by path instead. ``kubernetes_asyncio``'s loader
    keeps the files it writes for inline data in a per-process cache keyed by content, so a second
    session would be handed a path in the first one's folder, removed when it closed."""
    config = {**resolved.config}
    for kind, fields in DATA_FIELDS.items():
        entry = config[f"{kind}s"][0]
        body = dict(entry[kind])
        where = f"kubeconfig {resolved.source.shown}: context {resolved.context!r}"
        for field in fields:
            if not body.get(f"{field}-data"):
                continue
            data = _pem(body, field, where)
            path = folder / f"{kind}-{field}.pem"
            path.touch(mode=0o600)
            path.write_bytes(data or b"")
            del body[f"{field}-data"]
            body[field] = str(path)
        config[f"{kind}s"] = [{**entry, kind: body}]
    return config


def tls_failure_reason(err: BaseException) -> str:
    """What the TLS library says went wrong: a verification failure's message (``certificate has
    expired``), else its reason (``WRONG_VERSION_NUMBER``), else the error's text or type."""
    reason = getattr(err, "verify_message", None) or getattr(err, "reason", None)
    return str(reason) if reason else str(err) or type(err).__name__


def _check_key_pair(cert: bytes, key: bytes, where: str) -> None:
    with tempfile.TemporaryDirectory(prefix="miles-kubeconfig-") as folder:
        cert_file, key_file = Path(folder, "cert.pem"), Path(folder, "key.pem")
        cert_file.write_bytes(cert)
        key_file.write_bytes(key)
        try:
            ssl.create_default_context().load_cert_chain(cert_file, key_file)
        except (ssl.SSLError, ValueError) as err:
            raise KubeconfigError(
                f"{where}: client-certificate and client-key do not load as a key pair "
                f"({tls_failure_reason(err)})"
            ) from None


def _pem(section: Mapping[str, Any], field: str, where: str) -> bytes | None:
    data = section.get(f"{field}-data")
    if data:
        try:
            return base64.b64decode(str(data), validate=True)
        except (binascii.Error, ValueError):
            raise KubeconfigError(f"{where}: {field}-data is not base64") from None
    path = section.get(field)
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise KubeconfigError(f"{where}: {field} {path}: {err.strerror}") from None


def _entry(
    merged: Mapping[str, Any], section: str, name: Any, path: Path, context: str
) -> dict[str, Any]:
    kind = NAMED_SECTIONS[section]
    found = merged[section].get(name) if isinstance(name, str) else None
    if found is None:
        raise KubeconfigError(
            f"kubeconfig {path}: context {context!r} names {kind} {name!r}, which no "
            f"kubeconfig defines; add it or fix the context"
        )
    return dict(_mapping(found[1].get(kind), found[0], f"{kind} {name!r}"))


def _mapping(value: Any, path: Path, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise KubeconfigError(f"kubeconfig {path}: {what} is not a mapping")
    return value


def _with_absolute_paths(config: dict[str, Any], path: Path) -> dict[str, Any]:
    folder = path.resolve().parent
    for section, kind in NAMED_SECTIONS.items():
        entries = config.get(section)
        if not isinstance(entries, list):
            continue
        for entry in entries:
            body = entry.get(kind) if isinstance(entry, dict) else None
            if not isinstance(body, dict):
                continue
            for field in PATH_FIELDS.get(kind, ()):
                value = body.get(field)
                if isinstance(value, str) and value and not Path(value).is_absolute():
                    body[field] = str(folder / Path(value).expanduser())
    return config
