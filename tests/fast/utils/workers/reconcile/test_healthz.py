"""Fast layer: ``manager/healthz.py`` rows (CR ``pkg/healthz``'s bodies, codes, subpaths,
``?verbose``, ``?exclude``), served over a real socket on 127.0.0.1 by
``manager/http_server.py``."""

from __future__ import annotations

from http import HTTPStatus

import pytest

from miles.utils.workers.reconcile.manager.healthz import Checker, HealthChecks
from miles.utils.workers.reconcile.manager.http_server import (
    HttpServer,
    Request,
    Response,
    not_found,
)
from tests.fast.utils.workers.reconcile.http_probe import Answer, get


def _checks(**checks: Checker) -> HealthChecks:
    return HealthChecks("/healthz", checks)


async def _ask(checks: HealthChecks, target: str) -> Answer:
    async def handler(request: Request) -> Response:
        return checks.serve(request) if checks.serves(request.path) else not_found()

    async with HttpServer(handler, host="127.0.0.1", port=0, name="test") as server:
        return await get(server.port, target)


async def test_all_healthy_answers_a_bare_ok() -> None:
    answer = await _ask(_checks(a=lambda: None, b=lambda: None), "/healthz")
    assert (answer.status, answer.body) == (200, "ok")
    assert answer.headers["content-type"] == "text/plain; charset=utf-8"
    assert answer.headers["x-content-type-options"] == "nosniff"


async def test_a_failing_check_is_listed_sorted_with_its_reason_withheld() -> None:
    answer = await _ask(_checks(zeta=lambda: None, alpha=lambda: "secret reason"), "/healthz/")
    assert answer.status == HTTPStatus.INTERNAL_SERVER_ERROR
    assert answer.body == "[-]alpha failed: reason withheld\n[+]zeta ok\nhealthz check failed\n"


async def test_verbose_lists_every_check_on_success() -> None:
    answer = await _ask(_checks(b=lambda: None, a=lambda: None), "/healthz?verbose")
    assert (answer.status, answer.body) == (200, "[+]a ok\n[+]b ok\nhealthz check passed\n")


async def test_exclude_skips_a_failing_check_and_warns_about_unknown_names() -> None:
    checks = _checks(bad=lambda: "down", good=lambda: None)
    answer = await _ask(checks, "/healthz?exclude=bad&exclude=nope&verbose=1")
    assert answer.status == 200
    assert answer.body == (
        "[+]bad excluded: ok\n[+]good ok\n"
        'warn: some health checks cannot be excluded: no matches for "nope"\n'
        "healthz check passed\n"
    )
    assert (await _ask(checks, "/healthz?exclude=bad")).body == "ok"


async def test_a_check_alone_on_its_subpath_shows_its_reason() -> None:
    checks = _checks(bad=lambda: "lease expired", good=lambda: None)
    assert (await _ask(checks, "/healthz/good")).body == "ok"
    answer = await _ask(checks, "/healthz/bad")
    assert (answer.status, answer.body) == (500, "internal server error: lease expired\n")
    assert (await _ask(checks, "/healthz/other")).status == HTTPStatus.NOT_FOUND


async def test_no_checks_serves_the_default_ping() -> None:
    assert (await _ask(_checks(), "/healthz?verbose")).body == "[+]ping ok\nhealthz check passed\n"
    assert (await _ask(_checks(), "/healthz/ping")).body == "ok"


async def test_a_check_that_raises_fails_without_reaching_the_server() -> None:
    def broken() -> str | None:
        raise RuntimeError("boom")

    answer = await _ask(_checks(broken=broken), "/healthz/broken")
    assert (answer.status, answer.body) == (
        500,
        "internal server error: the check raised RuntimeError('boom')\n",
    )


def test_a_name_is_unique_per_endpoint() -> None:
    checks = _checks(a=lambda: None)
    with pytest.raises(ValueError, match="already taken"):
        checks.add("a", lambda: None)
    with pytest.raises(ValueError, match="endpoint"):
        HealthChecks("healthz")


def test_serves_its_endpoint_and_subpaths_only() -> None:
    checks = _checks()
    assert [checks.serves(path) for path in ("/healthz", "/healthz/x", "/healthzx", "/readyz")] == [
        True,
        True,
        False,
        False,
    ]
