"""Fast layer: the reflector's pure transition function, row by row of the record.

Each row of ``docs/reconcile-loop.md``'s ``k8s_reflector.py`` table that says where an outcome
leads is one (state, outcome) → state row here, called on ``_transition`` itself: no API, no
clock, no event loop. Backoff delays are drawn at jitter 0, so a first step waits ``RETRY``.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from miles.utils.workers.reconcile.backoff import backoff_schedule
from miles.utils.workers.reconcile.k8s_errors import (
    FrameDecodeError,
    KubernetesApiError,
    KubernetesConnectionError,
)
from miles.utils.workers.reconcile.k8s_reflector import (
    CONSISTENCY_CHECK,
    RETRY_AFTER_RETRIES,
    WatchErrorFrame,
    _Accepted,
    _BackingOff,
    _Caps,
    _Closed,
    _Failed,
    _Listed,
    _Listing,
    _Outcome,
    _Pacing,
    _Probing,
    _source_phase,
    _State,
    _Step,
    _StreamListing,
    _transition,
    _Waited,
    _Watching,
)
from miles.utils.workers.reconcile.k8s_values import PodWatchEvent
from miles.utils.workers.reconcile.status import SourcePhase

RETRY = 2.0
PROBES = _Caps(streams=False, probes=True)
CONTRACT = _Caps(streams=False, probes=False)
STREAMS = _Caps(streams=True, probes=True)


class _Stream:
    """Stands for the open streaming list a ``_Listed`` hands on; never read here."""

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> PodWatchEvent:
        raise StopAsyncIteration


STREAM = _Stream()


def pacing() -> _Pacing:
    return _Pacing(backoff_schedule(initial=RETRY))


def step(
    state: _State, outcome: _Outcome, caps: _Caps = PROBES, paced: _Pacing | None = None
) -> _Step:
    return _transition(state, outcome, caps, paced or pacing(), now=0.0, draw=0.0)


def api(code: int, reason: str = "", **kw: Any) -> KubernetesApiError:
    return KubernetesApiError(code, reason or f"code {code}", **kw)


def error_frame(code: int, reason: str = "") -> WatchErrorFrame:
    rejects = code in (410, 504)
    return WatchErrorFrame(PodWatchEvent("ERROR", None, None, rejects, reason, code=code))


def failed(err: BaseException, *, frames: int = 0, lasted: float = 0.0) -> _Failed:
    return _Failed(err, "7", frames, lasted)


REFUSED = KubernetesConnectionError("refused", refused=True)
RESET = ConnectionResetError("reset by peer")
IDLE = KubernetesConnectionError("no byte for 90 s", idle=True)
UNREADABLE = FrameDecodeError("not JSON", event_type="ADDED")


def later(then: _State) -> _BackingOff:
    assert not isinstance(then, _BackingOff)
    return _BackingOff(then, RETRY)


WATCH7 = _Watching("7")
REWATCH7 = _Watching("7", restart=True)
PROBE7 = _Probing("7")
UNREACHABLE = _Listing("server was unreachable")
EXPIRED = _Listing("cursor expired")
TOO_LARGE = _Listing("cursor too large")
CHECK = _Listing(CONSISTENCY_CHECK)
ROLLED_BACK = "Timeout: Too large resource version: 219, current: 214"

ROWS: list[tuple[str, _State, _Outcome, _Caps, _State]] = [
    # LIST / streaming list
    ("listing -> watch", _Listing(), _Listed("5"), PROBES, _Watching("5")),
    ("LIST failed", _Listing(), failed(api(500)), PROBES, later(_Listing())),
    (
        "relist failed keeps its reason",
        _Listing("cursor expired"),
        failed(api(500)),
        PROBES,
        later(EXPIRED),
    ),
    ("fallback LIST failed", _Listing(), failed(RESET), STREAMS, later(_StreamListing())),
    (
        "streamed -> same stream",
        _StreamListing(),
        _Listed("5", STREAM),
        STREAMS,
        _Watching("5", STREAM),
    ),
    (
        "stream closed early -> LIST",
        _StreamListing("x"),
        _Closed("3", 3, 0.2),
        STREAMS,
        _Listing("x"),
    ),
    ("stream failed -> LIST at once", _StreamListing(), failed(api(500)), STREAMS, _Listing()),
    ("stream 410 -> LIST at once", _StreamListing(), failed(api(410)), STREAMS, _Listing()),
    ("stream 504 -> LIST at once", _StreamListing(), failed(api(504)), STREAMS, _Listing()),
    ("stream 429 -> backoff", _StreamListing(), failed(api(429)), STREAMS, later(_StreamListing())),
    (
        "stream refused -> backoff",
        _StreamListing(),
        failed(REFUSED),
        STREAMS,
        later(_StreamListing()),
    ),
    ("stream broke -> LIST at once", _StreamListing(), failed(RESET), STREAMS, _Listing()),
    ("stream idle -> LIST at once", _StreamListing("x"), failed(IDLE), STREAMS, _Listing("x")),
    # cursor probe
    ("probe accepted", PROBE7, _Accepted("7"), PROBES, REWATCH7),
    ("probe refused", PROBE7, failed(REFUSED), PROBES, later(UNREACHABLE)),
    ("probe reset", PROBE7, failed(RESET), PROBES, later(UNREACHABLE)),
    ("probe 429", PROBE7, failed(api(429)), PROBES, later(PROBE7)),
    ("probe idle", PROBE7, failed(IDLE), PROBES, later(PROBE7)),
    ("probe 410", PROBE7, failed(api(410)), PROBES, later(EXPIRED)),
    ("probe Gone", PROBE7, failed(api(400, "Gone")), PROBES, later(EXPIRED)),
    ("probe 504", PROBE7, failed(api(504)), PROBES, later(TOO_LARGE)),
    ("probe 500", PROBE7, failed(api(500)), PROBES, later(_Listing("probe failed"))),
    (
        "probe 504, streaming",
        PROBE7,
        failed(api(504)),
        STREAMS,
        later(_StreamListing("cursor too large")),
    ),
    # watch closed
    ("closed -> probe", WATCH7, _Closed("9", 2, 0.1), PROBES, _Probing("9")),
    ("closed -> re-watch", WATCH7, _Closed("9", 2, 0.1), CONTRACT, _Watching("9", restart=True)),
    ("closed after 1 s silent", WATCH7, _Closed("7", 0, 5.0), PROBES, PROBE7),
    ("very short watch", WATCH7, _Closed("7", 0, 0.5), PROBES, later(PROBE7)),
    ("very short, contract", WATCH7, _Closed("7", 0, 0.5), CONTRACT, later(REWATCH7)),
    # watch closed with the opt-in consistency check due: relist at once, no probe
    ("check due -> relist", WATCH7, _Closed("9", 2, 5.0, True), PROBES, CHECK),
    ("check due, silent -> relist", WATCH7, _Closed("7", 0, 0.5, True), PROBES, CHECK),
    ("check due, contract", WATCH7, _Closed("9", 2, 5.0, True), CONTRACT, CHECK),
    (
        "check due, streams",
        WATCH7,
        _Closed("9", 2, 5.0, True),
        STREAMS,
        _StreamListing(CONSISTENCY_CHECK),
    ),
    # watch failed, the cursor kept
    ("watch 429", WATCH7, failed(api(429)), PROBES, later(PROBE7)),
    ("watch 429 frame", WATCH7, failed(error_frame(429)), PROBES, later(PROBE7)),
    ("watch refused", WATCH7, failed(REFUSED), PROBES, later(PROBE7)),
    ("watch broke", WATCH7, failed(RESET, frames=1), PROBES, PROBE7),
    ("watch broke after 1 s", WATCH7, failed(RESET, lasted=2.0), PROBES, PROBE7),
    ("watch broke at once", WATCH7, failed(RESET, lasted=0.2), PROBES, later(PROBE7)),
    ("watch idle", WATCH7, failed(IDLE, lasted=90.0), PROBES, PROBE7),
    ("watch broke, contract", WATCH7, failed(RESET, frames=1), CONTRACT, REWATCH7),
    # watch failed, relist
    ("watch 410", WATCH7, failed(api(410)), PROBES, later(EXPIRED)),
    ("watch Expired", WATCH7, failed(api(400, "Expired")), PROBES, later(EXPIRED)),
    ("watch 410 frame", WATCH7, failed(error_frame(410)), PROBES, later(EXPIRED)),
    ("watch 504 frame", WATCH7, failed(error_frame(504)), PROBES, later(TOO_LARGE)),
    ("watch 500 frame", WATCH7, failed(error_frame(500)), PROBES, later(_Listing("watch failed"))),
    ("watch 500", WATCH7, failed(api(500)), PROBES, later(_Listing("watch failed"))),
    (
        "watch unreadable",
        WATCH7,
        failed(UNREADABLE, frames=3),
        PROBES,
        later(_Listing("frame unreadable")),
    ),
    (
        "watch 410, streams",
        WATCH7,
        failed(api(410)),
        STREAMS,
        later(_StreamListing("cursor expired")),
    ),
    # backoff
    ("backoff done", later(PROBE7), _Waited(), PROBES, PROBE7),
    ("backoff done, relist", later(_Listing("x")), _Waited(), PROBES, _Listing("x")),
]


@pytest.mark.parametrize(
    ("state", "outcome", "caps", "expected"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_transition_row(state: _State, outcome: _Outcome, caps: _Caps, expected: _State) -> None:
    assert step(state, outcome, caps).state == expected


def test_every_failure_is_reported_and_a_relist_counted_by_its_reason() -> None:
    s = step(_Watching("7"), failed(api(410)))
    assert (s.error, s.relist, s.level) == (
        "KubernetesApiError: HTTP 410 code 410",
        "cursor expired",
        logging.WARNING,
    )
    assert s.what is not None
    assert "resourceVersion=7" in s.what
    quiet = step(_Watching("7"), _Closed("9", 2, 0.1))
    assert (quiet.what, quiet.error, quiet.relist) == (None, None, None)


def test_a_cursor_ahead_of_the_server_relists_after_one_step_with_one_line_naming_both() -> None:
    """The apiserver's answer to a cursor beyond its revision (etcd restored from an older
    snapshot), as v1.36.3 sends it to a LIST or a watch from that cursor."""
    too_large = api(504, "Timeout", message=ROLLED_BACK)
    for state, outcome in (
        (_Probing("219"), _Failed(too_large, "219")),
        (_Watching("219"), _Failed(too_large, "219")),
        (_Watching("219"), _Failed(error_frame(504, ROLLED_BACK), "219", 1)),
    ):
        s = step(state, outcome)
        assert s.state == later(TOO_LARGE)
        assert (s.relist, s.level) == ("cursor too large", logging.WARNING)
        assert s.what is not None
        assert "cursor resourceVersion=219 is ahead of the server's revision 214" in s.what


def test_a_due_consistency_check_is_counted_and_logged_once_at_info() -> None:
    s = step(_Watching("7"), _Closed("9", 2, 5.0, True))
    assert (s.relist, s.level, s.error) == (CONSISTENCY_CHECK, logging.INFO, None)
    assert s.what is not None
    assert "cursor 9" in s.what
    assert step(_Watching("7"), _Closed("9", 2, 5.0)).relist is None


def test_an_unreadable_frame_is_an_error_line_and_an_idle_re_watch_an_info_line() -> None:
    assert step(_Watching("7"), failed(UNREADABLE)).level == logging.ERROR
    assert step(_Watching("7"), failed(IDLE, lasted=90.0)).level == logging.INFO


def test_backoff_steps_double_from_the_first_and_carry_the_drawn_jitter() -> None:
    paced = pacing()
    delays = []
    for _ in range(4):
        s = step(_Listing(), failed(api(500)), paced=paced)
        assert isinstance(s.state, _BackingOff)
        delays.append(s.state.delay)
        paced = s.pacing
    assert delays == [RETRY, 2 * RETRY, 4 * RETRY, 8 * RETRY]
    jittered = _transition(_Listing(), failed(api(500)), PROBES, pacing(), now=0.0, draw=0.5)
    assert isinstance(jittered.state, _BackingOff)
    assert jittered.state.delay == 1.5 * RETRY


def test_retry_after_is_waited_alone_a_bounded_number_of_times_in_a_row() -> None:
    throttled = failed(api(429, retry_after=3.0))
    paced = pacing()
    for n in range(1, RETRY_AFTER_RETRIES + 1):
        s = step(_Watching("7"), throttled, paced=paced)
        assert s.state == _BackingOff(_Probing("7"), 3.0)
        assert s.pacing.retries_after == n
        assert s.pacing.schedule == paced.schedule
        paced = step(s.state, _Waited(), paced=s.pacing).pacing
        assert paced.retries_after == n
    s = step(_Watching("7"), throttled, paced=paced)
    assert s.pacing.retries_after == 0
    assert s.pacing.schedule.upcoming == 2 * RETRY


def test_retry_after_below_the_first_step_waits_the_first_step() -> None:
    s = step(_Watching("7"), failed(api(429, retry_after=0.5)))
    assert s.state == _BackingOff(_Probing("7"), RETRY)
    assert s.pacing.retries_after == 1


def test_progress_at_once_starts_the_retry_after_count_over() -> None:
    counted = _Pacing(backoff_schedule(initial=RETRY), retries_after=4)
    assert step(_Probing("7"), _Accepted("7"), paced=counted).pacing.retries_after == 0
    assert step(later(_Probing("7")), _Waited(), paced=counted).pacing.retries_after == 4


@pytest.mark.parametrize(
    ("state", "phase"),
    [
        (_Listing(), SourcePhase.LISTING),
        (_StreamListing(), SourcePhase.LISTING),
        (_Listing("cursor expired"), SourcePhase.RELISTING),
        (_Probing("7"), SourcePhase.WATCHING),
        (_Watching("7"), SourcePhase.WATCHING),
        (later(_Listing("x")), SourcePhase.BACKING_OFF),
    ],
)
def test_each_state_reports_one_source_phase(state: _State, phase: SourcePhase) -> None:
    assert _source_phase(state) is phase
