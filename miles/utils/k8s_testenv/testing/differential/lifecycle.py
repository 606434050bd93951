"""The differential harness's processes, started and stopped together: the writers' client and the
namespace, the HTTP fault proxy and the TCP proxy in front of it, client-go's oracle and our loop.

Go counterpart: none (what the differential harness runs both clients on).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from miles.utils.k8s_testenv import ApiServerName, ControlPlane, api_client
from miles.utils.k8s_testenv.http_fault_proxy import HttpFaultProxy
from miles.utils.k8s_testenv.tcp_proxy import TcpProxy
from miles.utils.k8s_testenv.testing.differential.config import SELECTOR, HarnessConfig, LogFn
from miles.utils.k8s_testenv.testing.differential.engine_pools import (
    ORACLE_RESOURCE,
    install_engine_pools,
)
from miles.utils.k8s_testenv.testing.differential.errors import HarnessAborted
from miles.utils.k8s_testenv.testing.differential.oracle_client import OracleProcess
from miles.utils.k8s_testenv.testing.differential.ours import OurLoopSettings, Ours

_T = TypeVar("_T")

OursFactory = Callable[[OurLoopSettings], AbstractAsyncContextManager[Ours]]


def _read_kubeconfig(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise HarnessAborted(
            f"kubeconfig {path} is not JSON: the harness points its server at the proxy and "
            "reads only the JSON kubeconfigs k8s_testenv writes"
        ) from err


def proxied_kubeconfig(source: Path, target: Path, proxy_url: str) -> Path:
    """A copy of a JSON kubeconfig whose every server is `proxy_url` (TLS stays end to end)."""
    config = _read_kubeconfig(source)
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = proxy_url
    target.write_text(json.dumps(config, indent=2) + "\n")
    target.chmod(0o600)
    return target


def server_address(kubeconfig: Path) -> tuple[str, int]:
    config = _read_kubeconfig(kubeconfig)
    current = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c for c in config["clusters"] if c["name"] == current["context"]["cluster"])
    url = urlsplit(cluster["cluster"]["server"])
    if url.hostname is None:
        raise HarnessAborted(f"kubeconfig {kubeconfig} has no server host")
    return url.hostname, url.port or 443


@contextlib.contextmanager
def logs_to(path: Path) -> Iterator[None]:
    """Routes the runtime's log records to `path` for the duration (warnings and up)."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


@dataclass(kw_only=True, eq=False)
class Rig:
    """`async with Rig(...) as rig:` both clients watch the target apiserver through
    `rig.proxy` (TCP) and then `rig.http_proxy` (HTTP); `rig.core` writes through the other one."""

    plane: ControlPlane
    oracle_binary: Path
    work_dir: Path
    config: HarnessConfig
    namespace: str
    ours_factory: OursFactory
    log: LogFn
    _stack: AsyncExitStack = field(default_factory=AsyncExitStack, init=False)
    _core: Any = field(default=None, init=False)
    _apps: Any = field(default=None, init=False)
    _proxy: TcpProxy | None = field(default=None, init=False)
    _http_proxy: HttpFaultProxy | None = field(default=None, init=False)
    _oracle: OracleProcess | None = field(default=None, init=False)
    _pool_oracle: OracleProcess | None = field(default=None, init=False)
    _custom: Any = field(default=None, init=False)
    _ours: Ours | None = field(default=None, init=False)

    @property
    def core(self) -> Any:
        """`CoreV1Api` on the writers' apiserver."""
        return _started(self._core)

    @property
    def apps(self) -> Any:
        """`AppsV1Api` on the writers' apiserver."""
        return _started(self._apps)

    @property
    def custom(self) -> Any:
        """`CustomObjectsApi` on the writers' apiserver."""
        return _started(self._custom)

    @property
    def pool_oracle(self) -> OracleProcess | None:
        """client-go's dynamic informer over engine pools, where the harness watches them."""
        return self._pool_oracle

    @property
    def proxy(self) -> TcpProxy:
        return _started(self._proxy)

    @property
    def http_proxy(self) -> HttpFaultProxy:
        return _started(self._http_proxy)

    @property
    def oracle(self) -> OracleProcess:
        return _started(self._oracle)

    @property
    def ours(self) -> Ours:
        return _started(self._ours)

    @property
    def target_kubeconfig(self) -> Path:
        return self._kubeconfig(self.config.target)

    async def restart_oracle(self) -> None:
        """A new client-go process in place of the oracle, as the etcd restore procedure restarts
        every client-go component: a reflector cannot see a rollback its cursor has passed."""
        for oracle in self._oracles():
            await oracle.aclose()
            await oracle.start()

    def _oracles(self) -> list[OracleProcess]:
        pools = [] if self._pool_oracle is None else [self._pool_oracle]
        return [self.oracle, *pools]

    def check_alive(self) -> None:
        """Raises `HarnessAborted` naming the first process that died."""
        for what, problem in (
            ("the TCP proxy", self.proxy.failure()),
            ("the HTTP proxy", self.http_proxy.failure()),
            ("the oracle", self.oracle.failure()),
            (
                "the engine pools' oracle",
                None if self._pool_oracle is None else self._pool_oracle.failure(),
            ),
            ("our loop", self.ours.failure()),
        ):
            if problem is not None:
                raise HarnessAborted(f"{what} died, so no comparison can be made: {problem}")

    async def __aenter__(self) -> Rig:
        async with AsyncExitStack() as stack:
            await self._start(stack)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stack.aclose()

    async def _start(self, stack: AsyncExitStack) -> None:
        from kubernetes_asyncio import client

        config = self.config
        self.work_dir.mkdir(parents=True, exist_ok=True)
        writer_api = await stack.enter_async_context(api_client(self._writer_kubeconfig))
        self._core = client.CoreV1Api(writer_api)
        self._apps = client.AppsV1Api(writer_api)
        self._custom = client.CustomObjectsApi(writer_api)
        await self._core.create_namespace({"metadata": {"name": self.namespace}})
        if config.engine_pools:
            async with api_client(self.target_kubeconfig) as target_api:
                await install_engine_pools(
                    writer_api=writer_api, target_api=target_api, namespace=self.namespace
                )
        self._http_proxy = await stack.enter_async_context(
            HttpFaultProxy(
                kubeconfig=self.target_kubeconfig,
                name="differential-http-proxy",
                history=config.proxy_history,
            )
        )
        stack.callback(_write_requests_of, self._http_proxy, self.work_dir / "proxy-requests.tsv")
        behind_http = self._http_proxy.write_kubeconfig(self.work_dir / "http-proxy.kubeconfig")
        host, port = server_address(behind_http)
        self._proxy = stack.enter_context(
            TcpProxy(upstream_host=host, upstream_port=port, name="differential-proxy")
        )
        proxied = proxied_kubeconfig(
            behind_http, self.work_dir / "proxied.kubeconfig", self._proxy.url
        )

        def oracle(log_name: str, resource: str = "") -> OracleProcess:
            return OracleProcess(
                binary=self.oracle_binary,
                kubeconfig=proxied,
                namespace=self.namespace,
                selector=SELECTOR,
                log_path=self.work_dir / log_name,
                watch_list=config.oracle_watch_list,
                resource=resource,
            )

        self._oracle = await stack.enter_async_context(oracle("oracle.log"))
        if config.engine_pools:
            self._pool_oracle = await stack.enter_async_context(
                oracle("oracle-enginepools.log", ORACLE_RESOURCE)
            )
        self._ours = await stack.enter_async_context(
            self.ours_factory(
                OurLoopSettings(
                    kubeconfig=proxied,
                    namespace=self.namespace,
                    selector=SELECTOR,
                    watch_timeout_seconds=config.watch_timeout_seconds,
                    streaming_list=config.streaming_list,
                    engine_pools=config.engine_pools,
                )
            )
        )
        self.log(
            f"differential: namespace {self.namespace}, clients on the {config.target} "
            f"apiserver through {self._proxy.url} and {self._http_proxy.url} (HTTP/1.1), "
            "writes through the other one; "
            f"oracle WatchListClient={'on' if config.oracle_watch_list else 'off'}, "
            f"ours streaming list={'on' if config.streaming_list else 'off'}; "
            f"engine pools {'watched too' if config.engine_pools else 'not watched'}; "
            f"logs in {self.work_dir}"
        )

    @property
    def _writer_kubeconfig(self) -> Path:
        return self._kubeconfig("cached" if self.config.target == "uncached" else "uncached")

    def _kubeconfig(self, name: ApiServerName) -> Path:
        plane = self.plane
        return plane.cached_kubeconfig if name == "cached" else plane.uncached_kubeconfig


def _write_requests_of(proxy: HttpFaultProxy, path: Path) -> None:
    """The HTTP proxy's request log (as long as its history) as lines: wall-clock time, the
    client's User-Agent, LIST or WATCH, the path and query, what the proxy did."""
    shift = time.time() - time.monotonic()
    with path.open("w") as out:
        for seen in proxy.seen():
            at = datetime.datetime.fromtimestamp(seen.at + shift).strftime("%H:%M:%S.%f")[:-3]
            verb = "WATCH" if seen.is_watch else seen.method
            out.write(f"{at}\t{seen.user_agent[:24]}\t{verb}\t{seen.target}\t{seen.outcome}\n")


def _started(part: _T | None) -> _T:
    if part is None:
        raise HarnessAborted("the harness is not started")
    return part
