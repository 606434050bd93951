"""Kubeconfig files read as kubectl reads them, and every bad one as one line with exit 2."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from miles.utils.workers.reconcile import cli
from miles.utils.workers.reconcile.cli.failures import CliError, describe_failure
from miles.utils.workers.reconcile.cli.kube_session import KubeTarget, _configure
from miles.utils.workers.reconcile.cli.kubeconfig import (
    KubeconfigError,
    find_kubeconfig,
    resolve_context,
)


def kubeconfig(
    *,
    current: str | None = "main",
    contexts: dict[str, dict[str, Any]] | None = None,
    clusters: dict[str, dict[str, Any]] | None = None,
    users: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "contexts": [
            {"name": n, "context": c}
            for n, c in (contexts or {"main": {"cluster": "c", "user": "u"}}).items()
        ],
        "clusters": [
            {"name": n, "cluster": c}
            for n, c in (clusters or {"c": {"server": "http://127.0.0.1:1"}}).items()
        ],
        "users": [{"name": n, "user": u} for n, u in (users or {"u": {"token": "t"}}).items()],
    }
    if current is not None:
        config["current-context"] = current
    return config


def write(path: Path, config: dict[str, Any] | str | bytes) -> Path:
    if isinstance(config, bytes):
        path.write_bytes(config)
    else:
        path.write_text(config if isinstance(config, str) else json.dumps(config))
    return path


def resolved(environ: dict[str, str], context: str | None = None) -> Any:
    source = find_kubeconfig(None, environ)
    assert source is not None
    return resolve_context(source, context)


def test_kubeconfig_list_merges_as_kubectl_does_first_file_wins(tmp_path: Path) -> None:
    """``clientcmd``: the first file to set current-context, or an entry's name, owns it."""
    first = write(
        tmp_path / "a",
        kubeconfig(
            current="ctx-a",
            contexts={"ctx-a": {"cluster": "shared", "user": "u", "namespace": "team-a"}},
            clusters={"shared": {"server": "https://first:6443"}},
        ),
    )
    second = write(
        tmp_path / "b",
        kubeconfig(
            current="ctx-b",
            contexts={
                "ctx-a": {"cluster": "other", "user": "u"},
                "ctx-b": {"cluster": "shared", "user": "u"},
            },
            clusters={"shared": {"server": "https://second:6443"}, "other": {"server": "x"}},
        ),
    )
    environ = {"KUBECONFIG": f"{first}:{tmp_path / 'missing'}:{second}"}
    chosen = resolved(environ)
    assert (chosen.context, chosen.server, chosen.namespace) == (
        "ctx-a",
        "https://first:6443",
        "team-a",
    )
    other = resolved(environ, context="ctx-b")
    assert (other.server, other.namespace) == ("https://first:6443", None)


def test_relative_paths_resolve_against_the_file_that_names_them(tmp_path: Path) -> None:
    folder = tmp_path / "conf"
    folder.mkdir()
    config = kubeconfig(
        clusters={"c": {"server": "https://x", "certificate-authority": "ca.pem"}},
        users={"u": {"client-certificate": "certs/u.pem", "client-key": "/abs/u.key"}},
    )
    chosen = resolved({"KUBECONFIG": str(write(folder / "config", config))})
    assert chosen.config["clusters"][0]["cluster"]["certificate-authority"] == str(
        folder.resolve() / "ca.pem"
    )
    user = chosen.config["users"][0]["user"]
    assert user["client-certificate"] == str(folder.resolve() / "certs/u.pem")
    assert user["client-key"] == "/abs/u.key"


async def test_namespace_is_the_contexts_unless_n_is_given(tmp_path: Path) -> None:
    path = write(
        tmp_path / "k",
        kubeconfig(contexts={"main": {"cluster": "c", "user": "u", "namespace": "team"}}),
    )
    target = KubeTarget(kubeconfig=str(path))
    _, namespace, server, context = await _configure(target, {}, str(tmp_path))
    assert (namespace, server, context) == ("team", "http://127.0.0.1:1", "main")
    flagged = KubeTarget(kubeconfig=str(path), namespace="mine")
    assert (await _configure(flagged, {}, str(tmp_path)))[1] == "mine"
    plain = write(tmp_path / "plain", kubeconfig())
    assert (await _configure(KubeTarget(kubeconfig=str(plain)), {}, str(tmp_path)))[1] == "default"


def test_an_empty_file_among_several_is_skipped_as_kubectl_skips_it(tmp_path: Path) -> None:
    empty = write(tmp_path / "empty", "")
    real = write(tmp_path / "real", kubeconfig())
    assert resolved({"KUBECONFIG": f"{empty}:{real}"}).context == "main"


NOT_A_CERT = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")

BAD_KUBECONFIGS: dict[str, tuple[Any, str]] = {
    "empty": ("", "the file is empty"),
    "whitespace": ("  \n\n", "the file is empty"),
    "not YAML": ("clusters: [\n  {name: c", "not YAML at line"),
    "not a mapping": ("- a\n- b\n", "a YAML list, not a kubeconfig mapping"),
    "a scalar": ("just words", "a YAML str, not a kubeconfig mapping"),
    "binary": (b"\x7fELF\x02\x01\x01\x00\x00\x00", "binary data, not a kubeconfig"),
    "not UTF-8": (b"\xff\xfe\xfa clusters", "not UTF-8 text"),
    "no current context": (kubeconfig(current=None), "no current-context is set"),
    "unknown context": (kubeconfig(current="gone"), "context 'gone' not found (contexts: main)"),
    "contexts not a list": ('{"contexts": 3, "current-context": "x"}', "contexts is not a list"),
    "context without cluster": (
        kubeconfig(contexts={"main": {"cluster": "nowhere", "user": "u"}}),
        "names cluster 'nowhere', which no kubeconfig defines",
    ),
    "cluster without server": (
        kubeconfig(clusters={"c": {"insecure-skip-tls-verify": True}}),
        "cluster 'c' has no server",
    ),
    "certificate data not base64": (
        kubeconfig(clusters={"c": {"server": "https://x", "certificate-authority-data": "@@"}}),
        "certificate-authority-data is not base64",
    ),
    "certificate data not a certificate": (
        kubeconfig(
            clusters={
                "c": {"server": "https://x", "certificate-authority-data": NOT_A_CERT.decode()}
            }
        ),
        "certificate-authority is not a usable certificate",
    ),
    "certificate file missing": (
        kubeconfig(clusters={"c": {"server": "https://x", "certificate-authority": "/no/ca"}}),
        "certificate-authority /no/ca: No such file or directory",
    ),
    "client key pair unusable": (
        kubeconfig(
            users={
                "u": {
                    "client-certificate-data": NOT_A_CERT.decode(),
                    "client-key-data": NOT_A_CERT.decode(),
                }
            }
        ),
        "client-certificate and client-key do not load as a key pair",
    ),
}


@pytest.mark.parametrize("mistake", sorted(BAD_KUBECONFIGS))
def test_every_bad_kubeconfig_is_one_line_naming_the_file_and_exit_2(
    mistake: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    content, problem = BAD_KUBECONFIGS[mistake]
    path = write(tmp_path / "kubeconfig", content)
    code = cli.main(
        ["watch", "--kubeconfig", str(path), "--selector", "app=x", "--parent-label", "cell"]
    )
    lines = capsys.readouterr().err.splitlines()
    assert code == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"miles-reconcile: error: kubeconfig {path}")
    assert problem in lines[0]


@pytest.mark.parametrize(
    ("argv", "environ", "problem"),
    [
        (["--kubeconfig", "/no/such"], {}, "kubeconfig /no/such (from --kubeconfig): no such file"),
        ([], {"KUBECONFIG": "/no/a:/no/b"}, "kubeconfig /no/a:/no/b (from $KUBECONFIG): no such"),
        (["--kubeconfig", "/"], {}, "kubeconfig /: is a directory"),
        (["--context", "x"], {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "--context x: no kubeconfig"),
        (
            [],
            {"KUBERNETES_SERVICE_HOST": "10.0.0.1"},
            "serviceaccount): Service host/port is not set; pass --kubeconfig",
        ),
        (
            [],
            {},
            "no Kubernetes configuration: no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config)"
            " and not in a pod (KUBERNETES_SERVICE_HOST unset, no"
            " /var/run/secrets/kubernetes.io/serviceaccount/token)",
        ),
    ],
)
def test_missing_kubeconfigs_are_one_line_and_exit_2(
    argv: list[str],
    environ: dict[str, str],
    problem: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    code = cli.main(["watch", *argv, "--selector", "app=x", "--parent-label", "cell"])
    lines = capsys.readouterr().err.splitlines()
    assert code == 2
    assert len(lines) == 1, lines
    assert problem in lines[0]


def test_kubeconfig_error_is_a_cli_error_with_the_line() -> None:
    assert str(KubeconfigError("kubeconfig /x: bad")) == "kubeconfig /x: bad"


async def test_without_a_kubeconfig_inside_a_pod_the_service_account_is_used(
    tmp_path: Path,
) -> None:
    """``rest.InClusterConfig``: the service host and port, the mounted token and CA, and the
    service account's namespace unless ``-n`` is given."""
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("sa-token")
    (account / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (account / "namespace").write_text("team-ns\n")
    environ = {
        "HOME": str(tmp_path),
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
    }
    configuration, namespace, server, context = await _configure(
        KubeTarget(), environ, str(tmp_path), account
    )
    assert (namespace, server, context) == ("team-ns", "https://10.0.0.1:443", None)
    assert configuration.api_key["BearerToken"] == "Bearer sa-token"
    assert configuration.ssl_ca_cert == str(account / "ca.crt")
    flagged = await _configure(KubeTarget(namespace="mine"), environ, str(tmp_path), account)
    assert flagged[1] == "mine"
    with pytest.raises(CliError, match="Service token file does not exist"):
        await _configure(KubeTarget(), environ, str(tmp_path), tmp_path / "none")


HOME = {"home": {"cluster": "c", "user": "u"}}


def _service_account(folder: Path) -> Path:
    folder.mkdir()
    (folder / "token").write_text("sa-token")
    (folder / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (folder / "namespace").write_text("team-ns\n")
    return folder


async def test_in_a_pod_the_service_account_comes_before_the_home_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """controller-runtime's ``config.GetConfig`` order: ``--kubeconfig``; unless ``KUBECONFIG`` is
    set, in-cluster; then ``KUBECONFIG`` or ``~/.kube/config``. A kubeconfig baked into an image's
    home never overrides the pod's own service account."""
    account = _service_account(tmp_path / "serviceaccount")
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".kube").mkdir()
    home_config = write(tmp_path / ".kube" / "config", kubeconfig(current="home", contexts=HOME))
    in_pod = {
        "HOME": str(tmp_path),
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
    }
    found = await _configure(KubeTarget(), in_pod, str(tmp_path), account)
    assert found[1:] == ("team-ns", "https://10.0.0.1:443", None)
    explicit = await _configure(
        KubeTarget(kubeconfig=str(home_config)), in_pod, str(tmp_path), account
    )
    assert explicit[3] == "home"
    from_env = {**in_pod, "KUBECONFIG": str(home_config)}
    assert (await _configure(KubeTarget(), from_env, str(tmp_path), account))[3] == "home"
    outside = {"HOME": str(tmp_path)}
    assert (await _configure(KubeTarget(), outside, str(tmp_path), account))[3] == "home"


async def test_a_missing_kubernetes_extra_is_named_before_any_configuration_is_looked_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without the ``[k8s]`` extra and without any configuration, the one line is the extra's (the
    installed wheel's ``watch`` said "no Kubernetes configuration" instead)."""
    monkeypatch.setitem(sys.modules, "kubernetes_asyncio", None)
    with pytest.raises(ImportError) as raised:
        await _configure(KubeTarget(), {}, str(tmp_path), tmp_path / "no-account")
    assert describe_failure(raised.value) == (
        "kubernetes_asyncio is not installed: pip install 'miles-reconcile[k8s]'"
    )
