"""Fast layer: ``leaderelection/leader_election.py`` and ``leaderelection/lease_lock.py`` on
``FakeLeaseApi`` and a ``FakeClock``: acquire, renew, loss at the renew deadline, takeover timed
from the candidate's own observation, release, conflicts, and every kind of bad Lease."""

from __future__ import annotations

import asyncio
import logging
import math
import random
from typing import Any

import pytest

from miles.utils.k8s_testenv.testing.lease_fakes import FakeLeaseApi
from miles.utils.workers.reconcile.clock import FakeClock
from miles.utils.workers.reconcile.leaderelection.leader_election import (
    JITTER_FACTOR,
    LeaderElector,
)
from miles.utils.workers.reconcile.leaderelection.lease_lock import (
    INT32_MAX,
    LeaderElectionRecord,
    LeaseLock,
    LeaseObject,
    parse_micro_time,
    record_from_spec,
    spec_from_record,
)

NS, NAME = "default", "leader"
LEASE, RENEW, RETRY = 15, 10.0, 2.0
MAX_POLL = RETRY * (1 + JITTER_FACTOR)


class Client:
    """One candidate's connection to the shared fake apiserver, with faults of its own, and the
    time of each read it made."""

    def __init__(self, api: FakeLeaseApi, clock: FakeClock) -> None:
        self.api, self.clock = api, clock
        self.down = False
        self.hang: asyncio.Event | None = None
        self.reads: list[tuple[float, dict[str, Any]]] = []

    async def _enter(self) -> None:
        if self.hang is not None:
            await self.hang.wait()
        if self.down:
            raise ConnectionError("connection refused")

    async def get_lease(self, *, namespace: str, name: str) -> LeaseObject:
        await self._enter()
        lease = await self.api.get_lease(namespace=namespace, name=name)
        self.reads.append((self.clock.time(), dict(lease.get("spec") or {})))
        return lease

    async def create_lease(self, *, namespace: str, lease: LeaseObject) -> LeaseObject:
        await self._enter()
        return await self.api.create_lease(namespace=namespace, lease=lease)

    async def replace_lease(self, *, namespace: str, name: str, lease: LeaseObject) -> LeaseObject:
        await self._enter()
        return await self.api.replace_lease(namespace=namespace, name=name, lease=lease)


def _elector(client: Any, clock: FakeClock, identity: str, **kwargs: Any) -> LeaderElector:
    lock = LeaseLock(lease_api=client, namespace=NS, name=NAME, identity=identity)
    return LeaderElector(lock=lock, clock=clock, **kwargs)


def _holder(api: FakeLeaseApi) -> Any:
    return api.spec(NS, NAME).get("holderIdentity")


async def _until(clock: FakeClock, condition: Any, limit: float, step: float = 0.1) -> float:
    """Advances the clock in steps until ``condition()``; returns the time it first held."""
    end = clock.time() + limit
    while not condition():
        assert clock.time() < end, f"not reached within {limit}s"
        await clock.advance(step)
    return clock.time()


def _foreign_lease(api: FakeLeaseApi, **spec: Any) -> None:
    api.leases[(NS, NAME)] = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": NAME, "namespace": NS, "resourceVersion": "0"},
        "spec": {},
    }
    api.edit(NS, NAME, **spec)


# -- construction ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"lease_duration": 10, "renew_deadline": 10.0}, "lease_duration must be greater"),
        ({"lease_duration": 15, "renew_deadline": 2.4, "retry_period": 2.0}, "renew_deadline must"),
        ({"lease_duration": 0}, "lease_duration"),
        ({"lease_duration": -15}, "lease_duration"),
        ({"lease_duration": 15.5}, "lease_duration must be a whole number"),
        ({"lease_duration": math.inf}, "lease_duration"),
        ({"renew_deadline": math.nan}, "renew_deadline"),
        ({"renew_deadline": -1.0}, "renew_deadline"),
        ({"retry_period": 0}, "retry_period"),
        ({"retry_period": True}, "retry_period"),
        ({"retry_period": "2"}, "retry_period"),
        ({"name": ""}, "name"),
    ],
)
async def test_go_constraints_are_checked_naming_the_argument(
    kwargs: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        _elector(FakeLeaseApi(), FakeClock(), "a", **kwargs)


async def test_defaults_are_client_go_s() -> None:
    elector = _elector(FakeLeaseApi(), FakeClock(), "a")
    assert (elector._lease_seconds, elector._renew_deadline, elector._retry_period) == (15, 10, 2)
    assert elector.identity == "a"
    assert elector.name == f"{NS}/{NAME}"


@pytest.mark.parametrize("argument", ["namespace", "name", "identity"])
async def test_lock_refuses_an_empty_name(argument: str) -> None:
    kwargs = {"namespace": NS, "name": NAME, "identity": "a", argument: ""}
    with pytest.raises(ValueError, match=argument):
        LeaseLock(lease_api=FakeLeaseApi(), **kwargs)


# -- the record on the Lease ----------------------------------------------------------------------


def test_record_round_trips_through_a_lease_spec_as_go_writes_it() -> None:
    at = parse_micro_time("2026-12-03T04:10:00.123456Z")
    record = LeaderElectionRecord("a", 15, at, at, 3)
    spec = spec_from_record(record)
    assert spec == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-12-03T04:10:00.123456Z",
        "renewTime": "2026-12-03T04:10:00.123456Z",
        "leaseTransitions": 3,
    }
    assert record_from_spec(spec) == (record, [])
    nobody = spec_from_record(LeaderElectionRecord(None, 1, None, None, 0))
    assert nobody["holderIdentity"] == ""
    assert nobody["renewTime"] is None


def test_an_empty_spec_reads_as_go_s_zero_record() -> None:
    assert record_from_spec({}) == (LeaderElectionRecord(None, 0, None, None, 0), [])
    assert record_from_spec(None) == (LeaderElectionRecord(None, 0, None, None, 0), [])


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"renewTime": "yesterday"}, "spec.renewTime is not a time"),
        ({"acquireTime": "0000-01-01T00:00:00.000000Z"}, "spec.acquireTime is not a time"),
        ({"renewTime": "2026-12-03T04:10:00"}, "spec.renewTime is not a time"),
        ({"renewTime": "9999-12-31T23:59:59-01:00"}, "spec.renewTime is not a time"),
        ({"renewTime": 1700000000}, "spec.renewTime is not a time"),
        ({"leaseDurationSeconds": "15"}, "spec.leaseDurationSeconds is not an integer"),
        ({"leaseDurationSeconds": 15.0}, "spec.leaseDurationSeconds is not an integer"),
        ({"leaseTransitions": True}, "spec.leaseTransitions is not an integer"),
        ({"leaseDurationSeconds": 2**40}, "spec.leaseDurationSeconds is outside int32"),
        ({"holderIdentity": ["b"]}, "spec.holderIdentity is not a string"),
    ],
)
def test_an_unreadable_field_reads_as_zero_and_is_named(spec: dict[str, Any], problem: str) -> None:
    record, problems = record_from_spec(spec)
    assert len(problems) == 1
    assert problems[0].startswith(problem)
    assert record.renew_time is None
    assert record.holder_identity in (None, "<unreadable: list ['b']>")
    assert record.lease_duration_seconds in (0, INT32_MAX)


def test_a_spec_that_is_not_an_object_is_named() -> None:
    record, problems = record_from_spec(["holderIdentity"])
    assert record == LeaderElectionRecord(None, 0, None, None, 0)
    assert problems
    assert problems[0].startswith("spec is not an object")


async def test_update_before_get_or_create_is_refused() -> None:
    lock = LeaseLock(lease_api=FakeLeaseApi(), namespace=NS, name=NAME, identity="a")
    with pytest.raises(RuntimeError, match="call get or create first"):
        await lock.update(LeaderElectionRecord("a", 15, None, None, 0))


async def test_update_keeps_the_rest_of_the_lease_and_is_refused_when_stale() -> None:
    """Go's ``Update`` writes the whole object last read, its spec replaced: a label someone set
    survives, and a write after someone else's is a 409."""
    api = FakeLeaseApi()
    _foreign_lease(api, holderIdentity="b", leaseDurationSeconds=15)
    api.leases[(NS, NAME)]["metadata"]["labels"] = {"team": "x"}
    lock = LeaseLock(lease_api=api, namespace=NS, name=NAME, identity="a")
    await lock.get()
    await lock.update(LeaderElectionRecord("a", 15, None, None, 1))
    assert api.leases[(NS, NAME)]["metadata"]["labels"] == {"team": "x"}
    assert _holder(api) == "a"
    api.edit(NS, NAME, holderIdentity="c")
    from miles.utils.workers.reconcile.leaderelection.lease_lock import LeaseConflictError

    with pytest.raises(LeaseConflictError):
        await lock.update(LeaderElectionRecord("a", 15, None, None, 1))


# -- acquire, renew, lose -------------------------------------------------------------------------


async def test_acquires_an_absent_lease_by_creating_it() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    async with _elector(api, clock, "a") as elector:
        await asyncio.wait_for(elector.wait_until_leading(), 1)
        assert elector.is_leader()
        assert elector.leader == "a"
        spec = api.spec(NS, NAME)
        assert spec["holderIdentity"] == "a"
        assert spec["leaseDurationSeconds"] == 15
        assert spec["leaseTransitions"] == 0
        assert parse_micro_time(spec["renewTime"]) is not None
        assert spec["acquireTime"] == spec["renewTime"]
        assert elector.check() is None


async def test_renews_every_retry_period_keeping_acquire_time_and_transitions() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    async with _elector(api, clock, "a") as elector:
        await elector.wait_until_leading()
        first = api.spec(NS, NAME)
        await clock.advance(RETRY)
        assert len(api.writes) == 2
        await clock.advance(RETRY * 10)
        assert len(api.writes) == 12
        spec = api.spec(NS, NAME)
        assert spec["acquireTime"] == first["acquireTime"]
        assert spec["renewTime"] > first["renewTime"]
        assert spec["leaseTransitions"] == 0
        assert elector.is_leader()


async def test_leadership_ends_at_the_renew_deadline_by_the_candidate_s_own_clock(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The apiserver goes away: ``is_leader()`` turns false exactly ``renew_deadline`` after the
    start of the last successful renew, the campaign ends, ``wait_until_lost`` returns."""
    api, clock = FakeLeaseApi(), FakeClock()
    client = Client(api, clock)
    caplog.set_level(logging.INFO)
    async with _elector(client, clock, "a") as elector:
        await elector.wait_until_leading()
        await clock.advance(RETRY)
        last_renew = clock.time()
        client.down = True
        lost = asyncio.ensure_future(elector.wait_until_lost())
        while clock.time() < last_renew + RENEW - 0.05:
            assert elector.is_leader(), f"still inside the deadline at {clock.time()}"
            await clock.advance(0.05)
        await clock.advance(0.1)
        assert not elector.is_leader()
        assert lost.done()
        assert elector._task is not None
        assert elector._task.done()
    lines = [r.getMessage() for r in caplog.records]
    assert sum("lost lease" in line for line in lines) == 1
    assert sum("acquired lease" in line for line in lines) == 1
    assert all(line.startswith(f"[{NS}/{NAME}]") for line in lines)
    failures = [line for line in lines if "retrying" in line]
    assert len(failures) == 1, "one line per distinct failure, not one per retry"


async def test_a_renewal_that_hangs_is_abandoned_at_the_deadline() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    client = Client(api, clock)
    async with _elector(client, clock, "a") as elector:
        await elector.wait_until_leading()
        acquired = clock.time()
        client.hang = asyncio.Event()
        end = await _until(clock, lambda: not elector.is_leader(), 20, 0.05)
        assert acquired + RENEW <= end <= acquired + RENEW + 0.1
        await clock.advance(0.1)
        assert elector._lost.is_set()
        client.hang.set()


async def test_another_holder_in_the_record_ends_leadership_at_once() -> None:
    """Someone writes another holder into the Lease: the leader's next renewal reads it and it
    stops leading then, without waiting for its deadline."""
    api, clock = FakeLeaseApi(), FakeClock()
    async with _elector(api, clock, "a") as elector:
        await elector.wait_until_leading()
        api.edit(NS, NAME, holderIdentity="intruder")
        await clock.advance(RETRY)
        assert not elector.is_leader()
        assert elector.leader == "intruder"
        assert elector._lost.is_set()


# -- takeover -------------------------------------------------------------------------------------


async def _takeover_after_silence(skewed_renew_time: str | None) -> tuple[float, float]:
    """``a`` leads and is cancelled without release; returns ``b``'s observation of ``a``'s last
    record and the time ``b`` acquired."""
    api, clock = FakeLeaseApi(), FakeClock()
    b_client = Client(api, clock)
    a = _elector(api, clock, "a", release_on_cancel=False)
    async with a:
        await a.wait_until_leading()
        async with _elector(b_client, clock, "b") as b:
            await clock.advance(RETRY * 3)
            assert a.is_leader()
            assert not b.is_leader()
            assert b.leader == "a"
            await a.__aexit__(None, None, None)
            last = api.spec(NS, NAME)
            assert last["holderIdentity"] == "a"
            if skewed_renew_time is not None:
                api.edit(NS, NAME, renewTime=skewed_renew_time)
                last = api.spec(NS, NAME)
            acquired = await _until(clock, b.is_leader, 40)
            seen = next(at for at, spec in b_client.reads if spec == last)
            assert api.spec(NS, NAME)["leaseTransitions"] == 1
    return seen, acquired


async def test_takeover_waits_lease_duration_from_the_candidate_s_own_observation() -> None:
    seen, acquired = await _takeover_after_silence(None)
    assert seen + LEASE <= acquired <= seen + LEASE + MAX_POLL + 0.1


@pytest.mark.parametrize(
    "renew_time", ["1970-01-01T00:00:00.000000Z", "2999-01-01T00:00:00.000000Z", "garbage"]
)
async def test_the_record_s_own_times_never_shorten_or_lengthen_a_lease(renew_time: str) -> None:
    """Clock skew: a renewTime far in the past, the future, or unreadable changes nothing."""
    seen, acquired = await _takeover_after_silence(renew_time)
    assert seen + LEASE <= acquired <= seen + LEASE + MAX_POLL + 0.1


async def test_release_on_exit_hands_over_at_the_next_poll() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    a = _elector(api, clock, "a")
    async with a:
        await a.wait_until_leading()
        async with _elector(api, clock, "b") as b:
            await clock.advance(RETRY * 3)
            transitions = api.spec(NS, NAME)["leaseTransitions"]
            await a.__aexit__(None, None, None)
            spec = api.spec(NS, NAME)
            assert spec["holderIdentity"] == ""
            assert spec["leaseDurationSeconds"] == 1
            assert spec["leaseTransitions"] == transitions
            assert not a.is_leader()
            assert a._lost.is_set()
            released = clock.time()
            acquired = await _until(clock, b.is_leader, MAX_POLL + 0.2)
            assert acquired <= released + MAX_POLL + 0.1
            assert api.spec(NS, NAME)["leaseTransitions"] == transitions + 1


async def test_without_release_on_cancel_the_lease_still_names_the_leader() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    async with _elector(api, clock, "a", release_on_cancel=False) as a:
        await a.wait_until_leading()
    assert _holder(api) == "a"
    assert not a.is_leader()


async def test_release_leaves_a_lease_someone_else_took_alone() -> None:
    """Go's ``tryRelease`` checks the record it last saw; ours checks the one it just read."""
    api, clock = FakeLeaseApi(), FakeClock()
    client = Client(api, clock)
    async with _elector(client, clock, "a") as a:
        await a.wait_until_leading()
        client.down = True
        await _until(clock, lambda: not a.is_leader(), 20)
        api.edit(NS, NAME, holderIdentity="b", leaseDurationSeconds=15)
        client.down = False
    assert _holder(api) == "b"


async def test_exit_release_gives_up_after_renew_deadline() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    client = Client(api, clock)
    elector = _elector(client, clock, "a")
    await elector.__aenter__()
    await elector.wait_until_leading()
    client.hang = asyncio.Event()
    exiting = asyncio.ensure_future(elector.__aexit__(None, None, None))
    await clock.advance(RENEW - 0.1)
    assert not exiting.done()
    assert not elector.is_leader(), "it stops leading before it tries to release"
    await clock.advance(0.2)
    assert exiting.done()
    assert exiting.exception() is None
    assert _holder(api) == "a"


# -- conflicts ------------------------------------------------------------------------------------


async def test_two_candidates_racing_for_an_absent_lease_elect_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    caplog.set_level(logging.INFO)
    async with _elector(api, clock, "a") as a, _elector(api, clock, "b") as b:
        await clock.advance(RETRY * 10)
        assert [a.is_leader(), b.is_leader()].count(True) == 1
        winner, loser = (a, b) if a.is_leader() else (b, a)
        assert loser.leader == winner.identity
        holders = {spec["holderIdentity"] for _, _, spec in api.writes}
        assert holders == {winner.identity}


async def test_a_write_by_someone_else_costs_the_leader_one_conflict_not_the_lease() -> None:
    """The optimistic renewal gets 409 (the resourceVersion moved), then the slow path reads the
    Lease, still its own, and renews it, keeping acquireTime and the transitions."""
    api, clock = FakeLeaseApi(), FakeClock()
    async with _elector(api, clock, "a") as a:
        await a.wait_until_leading()
        acquired = api.spec(NS, NAME)["acquireTime"]
        api.edit(NS, NAME, leaseTransitions=7)
        await clock.advance(RETRY)
        assert a.is_leader()
        spec = api.spec(NS, NAME)
        assert spec["leaseTransitions"] == 7
        assert spec["acquireTime"] == acquired
        assert spec["holderIdentity"] == "a"


# -- bad input ------------------------------------------------------------------------------------


async def _taken_at(api: FakeLeaseApi, clock: FakeClock, limit: float = 60) -> float:
    async with _elector(api, clock, "b") as b:
        return await _until(clock, b.is_leader, limit)


@pytest.mark.parametrize("claimed", [-5, 0, 1])
async def test_a_foreign_holder_claiming_a_short_lease_is_waited_out_as_ours(
    claimed: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A holder that never renews is taken after expiry, never before; a duration of its own
    below ours (a negative or zero one: the apiserver refuses those, a fake need not) is waited
    out as ``lease_duration``, so no edit can hand the lease over before our leader stops."""
    api, clock = FakeLeaseApi(), FakeClock()
    _foreign_lease(api, holderIdentity="ghost", leaseDurationSeconds=claimed)
    caplog.set_level(logging.WARNING)
    taken = await _taken_at(api, clock)
    assert LEASE <= taken <= LEASE + MAX_POLL + 0.1
    warnings = [
        r.getMessage() for r in caplog.records if "claims leaseDurationSeconds" in r.message
    ]
    assert len(warnings) == (1 if claimed <= 0 else 0)


async def test_a_foreign_holder_claiming_an_absurd_lease_is_never_taken_early(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    _foreign_lease(api, holderIdentity="ghost", leaseDurationSeconds=INT32_MAX)
    caplog.set_level(logging.WARNING)
    async with _elector(api, clock, "b") as b:
        await clock.advance(3600)
        assert not b.is_leader()
        assert b.leader == "ghost"
        assert _holder(api) == "ghost"
        assert api.calls < 3600 / RETRY + 5, "polls once per retry period, never spins"
    warnings = [
        r.getMessage() for r in caplog.records if "claims leaseDurationSeconds" in r.message
    ]
    assert len(warnings) == 1
    assert "ghost" in warnings[0]


@pytest.mark.parametrize(
    "spec",
    [
        {"renewTime": "not a time", "acquireTime": 42},
        {"renewTime": "0000-01-01T00:00:00.000000Z"},
        {"leaseDurationSeconds": "15"},
        {"holderIdentity": {"name": "ghost"}},
        {"leaseTransitions": -3},
    ],
)
async def test_an_unreadable_lease_is_logged_once_and_taken_only_after_expiry(
    spec: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    _foreign_lease(api, **{"holderIdentity": "ghost", "leaseDurationSeconds": 15, **spec})
    caplog.set_level(logging.WARNING)
    taken = await _taken_at(api, clock)
    assert LEASE <= taken <= LEASE + MAX_POLL + 0.1
    assert api.spec(NS, NAME)["leaseTransitions"] >= 0
    if spec != {"leaseTransitions": -3}:
        lines = [r.getMessage() for r in caplog.records if "cannot be read" in r.message]
        assert len(lines) == 1
        assert f"{NS}/{NAME}" in lines[0]


async def test_transitions_at_the_int32_limit_do_not_overflow() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    _foreign_lease(api, holderIdentity="", leaseDurationSeconds=1, leaseTransitions=INT32_MAX)
    async with _elector(api, clock, "b") as b:
        await b.wait_until_leading()
        assert api.spec(NS, NAME)["leaseTransitions"] == INT32_MAX


class _Broken(FakeLeaseApi):
    async def get_lease(self, *, namespace: str, name: str) -> LeaseObject:
        await asyncio.sleep(0)
        self.calls += 1
        return ["not", "a", "lease"]  # type: ignore[return-value]


async def test_an_api_answering_garbage_never_crashes_the_campaign(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api, clock = _Broken(), FakeClock()
    caplog.set_level(logging.WARNING)
    async with _elector(api, clock, "b") as b:
        await clock.advance(120)
        assert not b.is_leader()
        assert b.check() is None
        assert b._task is not None
        assert not b._task.done()
    assert api.calls <= 120 / RETRY + 2
    lines = [r.getMessage() for r in caplog.records if "cannot read lease" in r.message]
    assert len(lines) == 1


# -- never two leaders ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
async def test_never_two_leaders_under_cuts_hangs_edits_and_restarts(seed: int) -> None:
    """Three candidates on one Lease; every 20 s one of them is cut off, hung, or someone edits the
    Lease; a candidate that lost is restarted (as its process would be). Checked every 50 ms of
    fake time: never two ``is_leader()``, and the lease changes hands."""
    rng = random.Random(seed)
    api, clock = FakeLeaseApi(), FakeClock()
    clients = {name: Client(api, clock) for name in "abc"}
    electors: dict[str, LeaderElector] = {}
    reigns = [""]
    try:
        for tick in range(int(600 / 0.05)):
            for name, client in clients.items():
                if name not in electors or electors[name]._lost.is_set():
                    if name in electors:
                        await electors.pop(name).__aexit__(None, None, None)
                    release = rng.random() < 0.5
                    electors[name] = _elector(client, clock, name, release_on_cancel=release)
                    await electors[name].__aenter__()
            leaders = [name for name, elector in electors.items() if elector.is_leader()]
            assert len(leaders) <= 1, f"two leaders at {clock.time():.2f}: {leaders}"
            if leaders and leaders[0] != reigns[-1]:
                reigns.append(leaders[0])
            if tick % 400 == 0:
                _fault(rng, clients, api, leader=leaders[0] if leaders else None)
            await clock.advance(0.05)
        assert all(elector._failure is None for elector in electors.values())
    finally:
        _fault(rng, clients, api, heal_only=True)
        for elector in electors.values():
            await elector.__aexit__(None, None, None)
    assert len(reigns) >= 5, reigns


def _fault(
    rng: random.Random,
    clients: dict[str, Client],
    api: FakeLeaseApi,
    *,
    leader: str | None = None,
    heal_only: bool = False,
) -> None:
    """Heals every client, then hurts one: the leader two times in three."""
    for client in clients.values():
        client.down = False
        if client.hang is not None:
            client.hang.set()
            client.hang = None
    if heal_only:
        return
    victim = clients[leader if leader and rng.random() < 2 / 3 else rng.choice("abc")]
    kind = rng.choice(["down", "hang", "edit", "none"])
    if kind == "down":
        victim.down = True
    elif kind == "hang":
        victim.hang = asyncio.Event()
    elif kind == "edit" and (NS, NAME) in api.leases:
        api.edit(NS, NAME, leaseTransitions=rng.randrange(100))


# -- health ---------------------------------------------------------------------------------------


async def test_check_reports_a_leader_that_stopped_renewing() -> None:
    """Go's ``Check``: healthy as a standby and while renewing; a candidate whose last record
    names it but which has not renewed for ``lease_duration`` plus the tolerance is unhealthy."""
    api, clock = FakeLeaseApi(), FakeClock()
    client = Client(api, clock)
    async with _elector(client, clock, "a", release_on_cancel=False) as a:
        assert a.check() is None
        await a.wait_until_leading()
        await clock.advance(RETRY * 3)
        assert a.check() is None
        client.hang = asyncio.Event()
        await clock.advance(LEASE + 5)
        assert a.check(max_tolerable_expired_lease=30) is None
        assert a.check() is None
        await clock.advance(20)
        reason = a.check()
        assert reason is not None
        assert f"{NS}/{NAME}" in reason
        client.hang.set()


async def test_wait_until_leading_blocks_while_another_holds_the_lease() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    _foreign_lease(api, holderIdentity="ghost", leaseDurationSeconds=15)
    async with _elector(api, clock, "b") as b:
        waiting = asyncio.ensure_future(b.wait_until_leading())
        await clock.advance(10)
        assert not waiting.done()
        await _until(clock, b.is_leader, 20)
        await clock.advance(0)
        assert waiting.done()
