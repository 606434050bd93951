"""Where a client finds its apiserver (``k8s_config``): kubeconfig files read as kubectl reads
them, every bad one as one line with exit 2; the service account in a pod, in controller-runtime's
order; the service-account token re-read as client-go re-reads it (after 50 s, and before the next
request once one was refused 401). Unit tests on a fake clock."""

from __future__ import annotations

import base64
import json
import logging
import os
import ssl
import sys
from pathlib import Path
from typing import Any

import pytest

from miles.utils.k8s_testenv.certs import generate_serving_pair
from miles.utils.workers.reconcile import cli
from miles.utils.workers.reconcile.cli.failures import describe_failure
from miles.utils.workers.reconcile.k8s_api import (
    api_client_session,
    client_configuration,
    kube_session,
)
from miles.utils.workers.reconcile.k8s_config import (
    SERVICE_ACCOUNT,
    TOKEN_CACHE_SECONDS,
    ConfigurationError,
    KubeconfigError,
    KubeTarget,
    ServiceAccountToken,
    find_kubeconfig,
    in_cluster_config,
    resolve_config,
    resolve_context,
    tls_failure_reason,
)
from miles.utils.workers.reconcile.k8s_errors import InClusterConfigError


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


async def _configure(
    target: KubeTarget,
    environ: dict[str, str],
    temp_dir: str,
    service_account: Path = SERVICE_ACCOUNT,
) -> tuple[Any, str, str, str | None]:
    """The client's configuration, namespace, server and context ``target`` resolves to."""
    config = resolve_config(target, environ, service_account)
    configuration = await client_configuration(config, temp_dir)
    return configuration, config.namespace, config.server, config.context


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


def test_kubeconfig_error_is_a_configuration_error_with_the_line() -> None:
    assert str(KubeconfigError("kubeconfig /x: bad")) == "kubeconfig /x: bad"
    assert describe_failure(KubeconfigError("kubeconfig /x: bad")) == "kubeconfig /x: bad"


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
    with pytest.raises(ConfigurationError, match="Service token file does not exist"):
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
        async with kube_session(KubeTarget(), {}, tmp_path / "no-account"):
            pass
    assert describe_failure(raised.value) == (
        "kubernetes_asyncio is not installed: pip install 'miles-reconcile[k8s]'"
    )


class Configuration:
    def __init__(self) -> None:
        self.api_key: dict[str, str] = {}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def rotate(path: Path, token: str) -> None:
    """As the kubelet updates a projected volume: the new file is renamed over the old."""
    fresh = path.with_name(".token.new")
    fresh.write_text(token)
    os.replace(fresh, path)


def test_the_token_is_read_again_after_50_seconds(tmp_path: Path) -> None:
    path, clock, configuration = tmp_path / "token", Clock(), Configuration()
    path.write_text("first\n")
    token = ServiceAccountToken(path, clock=clock)
    token(configuration)
    assert configuration.api_key["BearerToken"] == "Bearer first"
    rotate(path, "second")
    clock.now += TOKEN_CACHE_SECONDS - 1
    token(configuration)
    assert configuration.api_key["BearerToken"] == "Bearer first"
    clock.now += 1
    token(configuration)
    assert configuration.api_key["BearerToken"] == "Bearer second"


def test_a_forgotten_token_is_read_before_the_next_request(tmp_path: Path) -> None:
    path, clock, configuration = tmp_path / "token", Clock(), Configuration()
    path.write_text("first")
    token = ServiceAccountToken(path, clock=clock)
    token(configuration)
    rotate(path, "second")
    token.forget()
    token(configuration)
    assert configuration.api_key["BearerToken"] == "Bearer second"


def test_an_unreadable_file_keeps_the_last_token_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, clock, configuration = tmp_path / "token", Clock(), Configuration()
    path.write_text("first")
    token = ServiceAccountToken(path, clock=clock)
    token(configuration)
    path.unlink()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            clock.now += TOKEN_CACHE_SECONDS
            token(configuration)
    assert configuration.api_key["BearerToken"] == "Bearer first"
    (line,) = [r.getMessage() for r in caplog.records]
    assert str(path) in line
    assert "keeping the one read before" in line
    path.write_text("second")
    clock.now += TOKEN_CACHE_SECONDS
    token(configuration)
    assert configuration.api_key["BearerToken"] == "Bearer second"


def test_a_token_never_read_is_a_configuration_error(tmp_path: Path) -> None:
    token = ServiceAccountToken(tmp_path / "token", clock=Clock())
    with pytest.raises(InClusterConfigError, match="cannot read the token"):
        token(Configuration())


def test_an_ipv6_service_host_is_bracketed_as_go_joins_it(tmp_path: Path) -> None:
    """``rest.InClusterConfig`` joins host and port with ``net.JoinHostPort``."""
    account = _service_account(tmp_path / "serviceaccount")
    environ = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    found = in_cluster_config(environ, account)
    assert (found.server, found.namespace) == ("https://[fd00::1]:443", "team-ns")
    assert found.ca_file == account / "ca.crt"


IN_POD = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}


@pytest.mark.parametrize(
    ("environ", "emptied", "problem"),
    [
        ({**IN_POD, "KUBERNETES_SERVICE_HOST": ""}, None, "Service host/port is set but empty"),
        ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, None, "Service host/port is not set"),
        (IN_POD, "token", "Token file exists but empty"),
        (IN_POD, "ca.crt", "Cert file exists but empty"),
    ],
)
def test_an_unusable_service_account_is_one_line_naming_its_folder(
    environ: dict[str, str], emptied: str | None, problem: str, tmp_path: Path
) -> None:
    """The lines ``kubernetes_asyncio``'s in-cluster loader gave, now read without it."""
    account = _service_account(tmp_path / "serviceaccount")
    if emptied:
        (account / emptied).write_text("")
    with pytest.raises(InClusterConfigError) as raised:
        in_cluster_config(environ, account)
    assert str(raised.value) == f"in-cluster configuration ({account}): {problem}"


class _Verification(ssl.SSLCertVerificationError):
    verify_message = "certificate has expired"


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (
            _Verification(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"),
            "certificate has expired",
        ),
        (ValueError("no certificate found"), "no certificate found"),
        (OSError(), "OSError"),
    ],
)
def test_a_tls_failure_reads_as_the_tls_librarys_reason(error: Exception, reason: str) -> None:
    """The transport's connection errors, the kubeconfig checks and the command's ``TLS setup
    failed`` line read the same reason: the verification message, else the reason, else the
    text, else the type."""
    assert tls_failure_reason(error) == reason


async def test_inline_certificate_data_serves_every_session_of_a_process(tmp_path: Path) -> None:
    """``kubernetes_asyncio``'s loader caches the files it writes for inline data, by content, for
    the whole process: the data is written to each session's own folder instead, so a second
    session is not handed a path in the first one's folder, removed when it closed."""
    pair = generate_serving_pair(tmp_path / "pki")

    def inline(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    config = kubeconfig(
        clusters={
            "c": {
                "server": "https://127.0.0.1:1",
                "certificate-authority-data": inline(pair.ca_cert),
            }
        },
        users={
            "u": {
                "client-certificate-data": inline(pair.serving_cert),
                "client-key-data": inline(pair.serving_key),
            }
        },
    )
    target = KubeTarget(kubeconfig=str(write(tmp_path / "kubeconfig", config)))
    written: list[Path] = []
    for _ in range(2):
        async with api_client_session(resolve_config(target, {})) as client:
            configuration = client.configuration
            files = [Path(configuration.ssl_ca_cert), Path(configuration.cert_file)]
            assert files[0].read_bytes() == pair.ca_cert.read_bytes()
            assert files[1].read_bytes() == pair.serving_cert.read_bytes()
            assert os.stat(configuration.key_file).st_mode & 0o077 == 0
            written += files
    assert not any(path.exists() for path in written)
