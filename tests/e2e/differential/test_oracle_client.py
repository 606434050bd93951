"""The oracle's stdin/stdout protocol, and what a dead or lying oracle turns into.

Layer: k8s_apiserver (differential), though it needs no cluster: a shell script stands in for the
oracle binary, so the failures are exact and quick.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from miles.utils.k8s_testenv.testing.differential.oracle_client import (
    OracleError,
    OracleProcess,
    parse_snapshot,
    process_gone,
)

_SNAPSHOT = (
    b'{"resourceVersion":"42","lists":2,"pods":[{"name":"a","uid":"u1",'
    b'"resourceVersion":"40","labels":{"k":"v"}}]}\n'
)


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "oracle.sh"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def _oracle(tmp_path: Path, binary: Path) -> OracleProcess:
    return OracleProcess(
        binary=binary,
        kubeconfig=tmp_path / "unused.kubeconfig",
        namespace="ns",
        selector="a=b",
        log_path=tmp_path / "oracle.log",
        read_timeout=2.0,
        exit_grace=0.5,
    )


def test_a_snapshot_line_parses_into_pods_by_name() -> None:
    snapshot = parse_snapshot(_SNAPSHOT)
    assert snapshot.synced
    assert snapshot.lists == 2
    assert snapshot.pods["a"].resource_version == "40"
    assert snapshot.pods["a"].labels == {"k": "v"}


def test_a_line_that_is_not_a_snapshot_is_an_error_quoting_it() -> None:
    with pytest.raises(OracleError, match="not a snapshot: b'klog noise'"):
        parse_snapshot(b"klog noise")


async def test_an_oracle_answering_each_line_yields_snapshots(tmp_path: Path) -> None:
    line = _SNAPSHOT.decode().strip()
    binary = _script(tmp_path, f"while read -r _; do echo '{line}'; done")
    async with _oracle(tmp_path, binary) as oracle:
        first = await oracle.snapshot()
        second = await oracle.snapshot()
    assert first == second
    assert first.resource_version == "42"


async def test_an_oracle_that_exited_is_reported_with_its_code_and_log(tmp_path: Path) -> None:
    binary = _script(tmp_path, "echo 'cannot load kubeconfig' >&2; exit 3")
    async with _oracle(tmp_path, binary) as oracle:
        with pytest.raises(OracleError, match=r"(?s)exited with code 3.*cannot load kubeconfig"):
            await oracle.snapshot()


async def test_an_oracle_that_never_answers_times_out_and_is_killed(tmp_path: Path) -> None:
    binary = _script(tmp_path, "trap '' TERM; exec sleep 600")
    oracle = _oracle(tmp_path, binary)
    async with oracle:
        pid = oracle.pid
        with pytest.raises(OracleError, match="did not answer within 2s"):
            await oracle.snapshot()
    assert pid is not None
    assert process_gone(pid)


async def test_a_missing_binary_is_named(tmp_path: Path) -> None:
    with pytest.raises(OracleError, match="oracle binary not found"):
        await _oracle(tmp_path, tmp_path / "absent").start()
