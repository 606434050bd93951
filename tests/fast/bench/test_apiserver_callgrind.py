"""bench/apiserver_callgrind.py: a window counts what runs inside it and nothing before it, its
dump says where the instructions went, and a machine without valgrind gets one line. Layer: fast
(no cluster; a real valgrind running a real Python child, which bootstrap installs)."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import pytest

from bench.apiserver_callgrind import Callgrind, self_costs, where
from bench.apiserver_kube_rs import ContenderUnavailable

WORKER = """
import sys
for line in sys.stdin:
    total = 0
    for i in range(int(line)):
        total += i * i
    print(total % 7, flush=True)
"""

needs_valgrind = pytest.mark.skipif(
    shutil.which("valgrind") is None, reason="no valgrind (scripts/bootstrap installs it as root)"
)


async def counted_loop(cg: Callgrind, seed: int, *, before: int, inside: int) -> int:
    """Instructions of a window running ``inside`` loop turns, after ``before`` turns uncounted."""
    process = await asyncio.create_subprocess_exec(
        *cg.wrapper("worker", seed),
        sys.executable,
        "-c",
        WORKER,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    stdin, stdout = process.stdin, process.stdout
    assert stdin is not None
    assert stdout is not None

    async def work(turns: int) -> None:
        stdin.write(f"{turns}\n".encode())
        await stdin.drain()
        assert await stdout.readline()

    try:
        await work(before)
        async with cg.counting(process.pid, cg.window_dump("worker", seed)) as count:
            await work(inside)
    finally:
        stdin.close()
        await process.wait()
    return count.instructions


@needs_valgrind
async def test_a_window_counts_its_own_work_and_not_the_work_before_it(tmp_path: Path) -> None:
    cg = Callgrind.find(tmp_path)
    alone = await counted_loop(cg, 1, before=1, inside=200_000)
    after_more = await counted_loop(cg, 2, before=4_000_000, inside=400_000)
    assert 1.6 < after_more / alone < 2.4, (alone, after_more)
    with cg.window_dump("worker", 2).open() as dump:
        costs = self_costs(dump)
    assert sum(costs.values()) <= after_more
    assert "python3" in costs.most_common(1)[0][0], costs.most_common(3)  # libpython or the binary


def test_self_costs_resolve_compressed_names_and_leave_calls_to_their_callee() -> None:
    dump = """events: Ir
ob=(1) /usr/lib/libssl.so.3
fl=(1) ssl.c
fn=(1) SSL_read
10 100
cob=(2) /opt/oracle/kube-rs-oracle
cfi=(2) de.rs
cfn=(2) <serde_json::de::Deserializer<R>>::parse
calls=3 20
11 5000
+1 20
ob=(2)
fl=(2)
fn=(2)
20 4000
fn=(3) main
* 7
"""
    costs = self_costs(dump.splitlines())
    assert costs == {
        "libssl.so.3": 120,
        "kube-rs-oracle: serde_json": 4000,
        "kube-rs-oracle": 7,
    }


def test_rust_paths_are_grouped_by_crate_and_c_functions_by_object() -> None:
    assert where("/x/_pydantic_core.so", "pydantic_core::validators::model::f") == (
        "_pydantic_core.so: pydantic_core"
    )
    assert where("/usr/lib/libc.so.6", "__memmove_avx_unaligned_erms") == "libc.so.6"
    assert where("/bin/kube-rs-oracle", "<&mut rustls::conn::X as std::io::Read>::read") == (
        "kube-rs-oracle: rustls"
    )


def test_no_valgrind_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ContenderUnavailable) as raised:
        Callgrind.find(tmp_path)
    assert "\n" not in str(raised.value)
    assert "apt-get install valgrind" in str(raised.value)
