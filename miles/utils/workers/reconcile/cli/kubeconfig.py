"""Kubeconfig files read and merged as kubectl reads them. Go: ``clientcmd``'s
``ClientConfigLoadingRules`` (``Load``, ``ResolveLocalPaths``) and ``DirectClientConfig``.

``--kubeconfig`` names one file, which must exist. Otherwise every file of ``$KUBECONFIG`` that
exists is merged, in order: the first file to set ``current-context``, or a cluster, user or context
of a given name, wins, and entries are never merged field by field. Without either,
``~/.kube/config``. Relative paths inside a file are resolved against that file's folder.

Every problem raises :class:`KubeconfigError`, whose message names the file and says what is wrong.
Nothing here opens a connection; ``kube_session`` does.
"""

from __future__ import annotations

import base64
import binascii
import os
import ssl
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miles.utils.workers.reconcile.cli.failures import CliError

DEFAULT_KUBECONFIG = Path("~/.kube/config")
NAMED_SECTIONS = {"clusters": "cluster", "users": "user", "contexts": "context"}
PATH_FIELDS = {
    "cluster": ("certificate-authority",),
    "user": ("client-certificate", "client-key", "tokenFile"),
}


class KubeconfigError(CliError):
    """A kubeconfig that cannot be used; the message names the file and the problem."""


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
                f"{where}: certificate-authority is not a usable certificate ({_ssl_reason(err)})"
            ) from None
    cert = _pem(user, "client-certificate", where)
    key = _pem(user, "client-key", where)
    if cert is not None and key is not None:
        _check_key_pair(cert, key, where)


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
                f"({_ssl_reason(err)})"
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


def _ssl_reason(err: Exception) -> str:
    return getattr(err, "reason", None) or str(err) or type(err).__name__


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
