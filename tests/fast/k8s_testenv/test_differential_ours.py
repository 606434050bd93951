"""The differential's our-side process protocol (`ours.py`) and the soak's sampler, without a
cluster: a child serving a stub answers the harness's requests, and closing it leaves no process."""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from bench.soak_sampler import ResourceSampler, Sample, pods_and_time_fit, read_samples
from miles.utils.k8s_testenv.testing.differential.oracle_client import process_gone
from miles.utils.k8s_testenv.testing.differential.ours import (
    OurLoopError,
    OurLoopProcess,
    OurLoopSettings,
    parse_settings_argument,
    settings_argument,
)
from miles.utils.k8s_testenv.testing.differential.views import PodRow


def _settings(tmp_path: Path) -> OurLoopSettings:
    return OurLoopSettings(
        kubeconfig=tmp_path / "kubeconfig",
        namespace="ns-1",
        selector="a=b",
        watch_timeout_seconds=5,
        streaming_list=True,
    )


def test_settings_survive_the_command_line(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    assert parse_settings_argument(settings_argument(settings)) == settings


async def test_a_child_answers_views_faults_and_forgets_then_exits(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    child = OurLoopProcess(
        _settings(tmp_path), module="tests.fast.k8s_testenv.ours_stub", log_path=log
    )
    async with child as ours:
        pid = child.pid
        assert pid is not None
        await ours.reconcile_fault(delay=0.5, raises=True)
        await ours.forget_recordings()
        views = await ours.views()
        assert ours.failure() is None
    crash_looping = "Running ready=False; main ready=False r=2 waiting:CrashLoopBackOff last=7"
    assert views.store == {"p-1": PodRow("ns-1", "1", "cell-0", crash_looping)}
    assert views.reconciled == {"p-1": PodRow("ns-1", "(0.5, True)", "cell-0+cell-1")}
    assert views.lists == 7
    assert process_gone(pid)
    assert "stray output" in log.read_text()


async def test_a_child_that_cannot_start_is_named_with_its_log(tmp_path: Path) -> None:
    child = OurLoopProcess(
        _settings(tmp_path), module="tests.fast.k8s_testenv.no_such_module", log_path=tmp_path / "l"
    )
    with pytest.raises(OurLoopError, match="exited with code 1") as caught:
        async with child:
            pass
    assert "no_such_module" in str(caught.value)


async def test_the_sampler_reports_the_heap_and_what_a_trim_gives_back(tmp_path: Path) -> None:
    sampler = ResourceSampler(
        period=3600,
        warmup=0,
        log_path=tmp_path / "resources.tsv",
        stored_pods=lambda: 10,
        title="this test",
        pod_kib=1024,
        trace_allocations=False,
    )
    async with sampler:
        pass
    first = sampler.samples[0]
    assert math.isclose(first.rss_less_pods_mib, first.rss_mib - 10, abs_tol=0.02)
    assert first.heap_used_mib > 0
    assert first.pymalloc_arenas_mib >= first.pymalloc_used_mib > 0
    assert first.rss_anon_mib <= first.rss_mib
    report = sampler.report()
    assert "resources of this test" in report
    assert "malloc_trim(0) at the end" in report
    assert "tracemalloc: off" in report
    assert len((tmp_path / "resources.tsv").read_text().splitlines()) == 3


def _sample(at: float, pods: int, rss: float) -> Sample:
    values: dict[str, Any] = {f.name: 0 for f in fields(Sample)}
    return Sample(**{**values, "at": at, "stored_pods": pods, "rss_mib": rss})


def test_the_fit_tells_growth_per_pod_from_growth_per_hour() -> None:
    pods = [100, 300, 200, 500, 400, 700, 600, 900]
    samples = [_sample(600.0 * i, n, 50 + n * 20 / 1024 + 10 * i / 6) for i, n in enumerate(pods)]
    fit = pods_and_time_fit(samples, pods)
    assert fit is not None
    assert math.isclose(fit[0], 20, rel_tol=1e-6)
    assert math.isclose(fit[1], 10, rel_tol=1e-6)
    assert pods_and_time_fit(samples, [10 * i for i in range(len(pods))]) is None


def test_a_written_tsv_reads_back_as_its_samples(tmp_path: Path) -> None:
    path = tmp_path / "resources.tsv"
    written = [_sample(10.0 * i, i, 80.5 + i) for i in range(3)]
    names = [f.name for f in fields(Sample)]
    rows = ["\t".join(str(getattr(s, n)) for n in names) for s in written]
    path.write_text("\n".join(["\t".join(names), *rows]) + "\n")
    assert read_samples(path) == written
