"""bench/apiserver.py: a contender that cannot be built is skipped with one line, never a traceback,
and the targets of the contenders that ran still decide the exit status. Layer: fast (no cluster;
cargo is a stand-in script)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from bench.apiserver import build_compiled
from bench.apiserver_kube_rs import CARGO_ENV, ContenderUnavailable, ensure_kube_rs
from bench.apiserver_report import check_targets
from bench.report import Results, Values


def fake_cargo(tmp_path: Path, build_script: str) -> Path:
    """A ``cargo`` that answers ``--version`` and runs ``build_script`` for ``build``."""
    cargo = tmp_path / "cargo"
    cargo.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then echo "cargo 1.95.0 (fake)"; exit 0; fi\n'
        f"{build_script}\n"
    )
    cargo.chmod(cargo.stat().st_mode | stat.S_IXUSR)
    return cargo


def crate(tmp_path: Path) -> Path:
    root = tmp_path / "crate"
    (root / "src").mkdir(parents=True)
    for name in ("Cargo.toml", "Cargo.lock", "src/main.rs"):
        (root / name).write_text(name)
    return root


def test_a_refused_crate_is_one_line_naming_cargos_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cargo = fake_cargo(
        tmp_path,
        'echo "   Compiling something" >&2\n'
        'echo "error: failed to download from the registry: crate kube refused" >&2\nexit 101',
    )
    monkeypatch.setenv(CARGO_ENV, str(cargo))
    with pytest.raises(ContenderUnavailable) as raised:
        ensure_kube_rs(lambda _: None, crate=crate(tmp_path), cache=tmp_path / "cache")
    message = str(raised.value)
    assert "\n" not in message
    assert "exited with 101" in message
    assert "crate kube refused" in message


def test_no_cargo_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CARGO_ENV, str(tmp_path / "no-such-cargo"))
    with pytest.raises(ContenderUnavailable, match="is not an executable"):
        ensure_kube_rs(lambda _: None, crate=crate(tmp_path), cache=tmp_path / "cache")


def test_a_build_that_leaves_no_binary_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CARGO_ENV, str(fake_cargo(tmp_path, "exit 0")))
    with pytest.raises(ContenderUnavailable, match="built no"):
        ensure_kube_rs(lambda _: None, crate=crate(tmp_path), cache=tmp_path / "cache")


def test_a_built_binary_is_reused_until_the_sources_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    calls = tmp_path / "calls"
    binary = cache / "target" / "release" / "kube-rs-oracle"
    script = f"echo build >> {calls}\nmkdir -p {binary.parent}\ntouch {binary}\nexit 0"
    monkeypatch.setenv(CARGO_ENV, str(fake_cargo(tmp_path, script)))
    root = crate(tmp_path)
    for _ in range(2):
        assert ensure_kube_rs(lambda _: None, crate=root, cache=cache) == binary
    assert calls.read_text().count("build") == 1
    (root / "src" / "main.rs").write_text("changed")
    ensure_kube_rs(lambda _: None, crate=root, cache=cache)
    assert calls.read_text().count("build") == 2


def test_build_compiled_skips_instead_of_raising(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CARGO_ENV, "/nonexistent/cargo")
    binaries, skipped = build_compiled(["ours", "kube-rs"], settings=None)
    assert binaries == {}
    assert list(skipped) == ["kube-rs"]
    assert "/nonexistent/cargo" in skipped["kube-rs"]


def one_round(**contenders: Values) -> Results:
    return Results(rounds=[dict(contenders)])


def test_targets_of_a_skipped_contender_are_not_judged(capsys: pytest.CaptureFixture[str]) -> None:
    results = one_round(
        ours={"sync_s": 1.0, "cpu_per_event": 1e-4, "lag_p99": 0.1, "rss_per_pod": 1000.0},
        go={"sync_s": 3.0, "lag_p99": 0.2, "rss_per_pod": 3000.0},
        ka={"sync_s": 7.0},
        floor={"sync_s": 0.9},
    )
    assert check_targets(results, skipped={"kube-rs": "no cargo"})
    printed = capsys.readouterr().out
    assert "vs kube-rs: no more than kube-rs's: n/a (kube-rs skipped)" in printed
    assert "(without kube-rs: skipped)" in printed


def test_a_missed_target_of_a_contender_that_ran_fails(
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = one_round(
        ours={"sync_s": 1.0, "rss_per_pod": 2000.0},
        go={"sync_s": 3.0, "rss_per_pod": 3000.0},
        floor={"sync_s": 0.9},
    )
    assert not check_targets(results, skipped={})
    assert "at most half of client-go's: ours is 1.50x better, needs 2.00 -> MISSED" in (
        capsys.readouterr().out
    )
