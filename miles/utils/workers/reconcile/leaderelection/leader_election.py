"""Leader election over a Lease: one candidate leads, the others wait for its lease to expire. Go:
client-go's ``tools/leaderelection`` (``LeaderElector``, ``HealthzAdaptor.Check``).

``async with LeaderElector(lock=...)`` campaigns in a task the elector owns, as Go's ``Run``: it
polls the Lease every ``retry_period`` (jittered by ``JITTER_FACTOR``, Go's ``wait.JitterUntil``)
until it acquires it, then renews it every ``retry_period``; a renewal that does not succeed within
``renew_deadline`` of the last one loses leadership, and the campaign ends (``wait_until_lost``).
Leaving the block stops the campaign and, with ``release_on_cancel``, releases a lease it holds.

A candidate leads for one term at most: it starts at the first successful write, and ends at the
loss or the release; a new term is a new ``LeaderElector``. Each change of it is logged at the
moment it takes effect, before anyone can see it: "successfully acquired lease" before
``is_leader()`` first returns true (so before any work it gates, as Go logs it inside ``acquire``
before ``OnStartedLeading`` runs), "lost lease" and "stopped leading" before it first returns false.
A term that runs past its renew deadline ends in the first ``is_leader()`` call that sees it,
whoever makes it, since by then nothing else may have run.

Time is the elector's own clock, never the record's: a lease held by another is expired once
``leaseDurationSeconds`` passed since this candidate last saw the record change (Go's
``observedTime``), so clock skew between nodes cannot cut a lease short. ``is_leader()`` is true
only until ``renew_deadline`` after the start of the last successful write, which is shorter than
the ``lease_duration`` any other candidate waits after seeing that write: a candidate that is
paused or cut off stops acting before another may take over.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, TypeVar

from miles.utils.workers.reconcile.arguments import positive_finite, positive_whole
from miles.utils.workers.reconcile.clock import Clock, RealClock
from miles.utils.workers.reconcile.leaderelection.lease_lock import (
    INT32_MAX,
    LeaderElectionRecord,
    LeaseConflictError,
    LeaseLock,
    LeaseNotFoundError,
)
from miles.utils.workers.reconcile.log import NamedLogger
from miles.utils.workers.reconcile.tasks import finished, first_of

logger = logging.getLogger(__name__)

JITTER_FACTOR = 1.2
"""Go's ``leaderelection.JitterFactor``: an acquire poll waits ``retry_period`` times 1 to 2.2."""
DEFAULT_LEASE_DURATION = 15.0
DEFAULT_RENEW_DEADLINE = 10.0
DEFAULT_RETRY_PERIOD = 2.0
DEFAULT_MAX_TOLERABLE_EXPIRED_LEASE = 20.0
"""``check``'s grace past an unrenewed lease: kube-controller-manager's and kube-scheduler's
``NewLeaderHealthzAdaptor(20 * time.Second)``."""
IMPLAUSIBLE_LEASE_SECONDS = 86400
"""A holder's ``leaseDurationSeconds`` above this is logged (and still waited out)."""

_T = TypeVar("_T")


class _Outcome(enum.Enum):
    DONE = enum.auto()
    CONFLICT = enum.auto()


class _Term(enum.Enum):
    """Where this candidate is in its one term."""

    CANDIDATE = enum.auto()
    LEADING = enum.auto()
    ENDED = enum.auto()


class LeaderElector:
    """One candidate for the lease ``lock`` names, under the identity ``lock.identity``."""

    def __init__(
        self,
        *,
        lock: LeaseLock,
        lease_duration: float = DEFAULT_LEASE_DURATION,
        renew_deadline: float = DEFAULT_RENEW_DEADLINE,
        retry_period: float = DEFAULT_RETRY_PERIOD,
        release_on_cancel: bool = True,
        clock: Clock | None = None,
        name: str | None = None,
    ) -> None:
        self._lease_seconds = positive_whole("lease_duration", lease_duration)
        self._renew_deadline = positive_finite("renew_deadline", renew_deadline)
        self._retry_period = positive_finite("retry_period", retry_period)
        if self._lease_seconds <= self._renew_deadline:
            raise ValueError(
                f"lease_duration must be greater than renew_deadline, got lease_duration="
                f"{lease_duration!r} and renew_deadline={renew_deadline!r}"
            )
        if self._renew_deadline <= self._retry_period * JITTER_FACTOR:
            raise ValueError(
                f"renew_deadline must be greater than retry_period * {JITTER_FACTOR}, got "
                f"renew_deadline={renew_deadline!r} and retry_period={retry_period!r}"
            )
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        self._lock = lock
        self._release_on_cancel = bool(release_on_cancel)
        self._clock: Clock = RealClock() if clock is None else clock
        self.name = lock.describe() if name is None else name
        self.identity = lock.identity
        self._log = NamedLogger(logger, self.name)
        self._random = random.Random()
        self._observed: LeaderElectionRecord | None = None
        self._observed_raw: bytes | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None
        self._term = _Term.CANDIDATE
        self._reported_leader: str | None = None
        self._wrote = False
        self._last_error: str | None = None
        self._leading_waiters: list[asyncio.Future[None]] = []
        self._lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None

    # -- what a caller reads -------------------------------------------------------------------

    def is_leader(self) -> bool:
        """True while this candidate holds the lease by its own clock: the record last seen names
        it, and ``renew_deadline`` has not passed since the start of its last successful acquire
        or renew. Stronger than Go's ``IsLeader`` (the record last seen names it). The first call
        that finds the deadline passed ends the term, and logs it, before it returns false."""
        renewed_at = self._renewed_at
        if self._term is not _Term.LEADING or renewed_at is None:
            return False
        if self._clock.time() < renewed_at + self._renew_deadline:
            return True
        self._end_term(
            logging.WARNING,
            "lost lease %s: not renewed within renew_deadline=%ss",
            self._lock.describe(),
            self._renew_deadline,
        )
        return False

    @property
    def leader(self) -> str | None:
        """The holder in the record last seen; ``None`` if nobody holds it or nothing was seen.
        Go: ``GetLeader``."""
        return _holder(self._observed)

    async def wait_until_leading(self) -> None:
        """Returns once ``is_leader()`` is true (at once if it is)."""
        while not self.is_leader():
            waiter = asyncio.get_running_loop().create_future()
            self._leading_waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._leading_waiters:
                    self._leading_waiters.remove(waiter)

    async def wait_until_lost(self) -> None:
        """Returns once this candidate led and then stopped leading (lost the lease or released
        it). A controller exits on it, as controller-runtime's manager does."""
        await self._lost.wait()

    def check(
        self, max_tolerable_expired_lease: float = DEFAULT_MAX_TOLERABLE_EXPIRED_LEASE
    ) -> str | None:
        """``None`` when healthy, else why not. Go: ``LeaderElector.Check``: a candidate that holds
        the lease by the record it last saw, and saw it more than ``lease_duration`` plus
        ``max_tolerable_expired_lease`` ago, failed to renew without stopping. Also unhealthy: a
        campaign that died."""
        if self._failure is not None:
            return f"leader election on {self._lock.describe()} died: {self._failure!r}"
        if not self._holds(self._observed):
            return None
        silent = self._clock.time() - self._observed_at
        if silent > self._lease_seconds + max_tolerable_expired_lease:
            return (
                f"failed election to renew leadership on lease {self._lock.describe()}: "
                f"last renewed {silent:.3g}s ago"
            )
        return None

    # -- lifecycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> LeaderElector:
        if self._task is not None:
            raise RuntimeError("a LeaderElector campaigns once: enter it once")
        self._task = asyncio.create_task(self._campaign(), name=f"leader-election {self.name}")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        task = self._task
        assert task is not None
        self._end_term(
            logging.INFO,
            "stopped leading lease %s: leaving%s",
            self._lock.describe(),
            ", releasing it" if self._release_on_cancel else "",
        )
        task.cancel()
        await asyncio.wait([task])
        if self._release_on_cancel and self._wrote:
            await self._release()

    async def _campaign(self) -> None:
        try:
            self._log.info("attempting to acquire lease %s", self._lock.describe())
            await self._acquire()
            await self._renew()
            if self._release_on_cancel:
                await self._release()
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            self._failure = error
            self._log.error("leader election stopped: %r", error, exc_info=error)
            self._end_term(
                logging.WARNING, "lost lease %s: leader election stopped", self._lock.describe()
            )
            raise

    async def _acquire(self) -> None:
        """Returns once a write made this candidate the holder (the term started in it)."""
        while not await self._attempt(self._renew_deadline):
            jitter = self._random.random() * JITTER_FACTOR * self._retry_period
            await self._clock.sleep(self._retry_period + jitter)

    async def _renew(self) -> None:
        """Returns once the term ended: ``renew_deadline`` passed since the last successful write,
        or the record names another holder. Go's ``wait.Until`` around
        ``PollUntilContextTimeout``: renew every ``retry_period``, retrying each ``retry_period``
        until the deadline."""
        while self._term is _Term.LEADING:
            await self._clock.sleep(self._retry_period)
            while not await self._attempt(self._remaining()) and self.is_leader():
                await self._clock.sleep(min(self._retry_period, self._remaining()))

    def _remaining(self) -> float:
        if self._renewed_at is None:
            return 0.0
        return self._renewed_at + self._renew_deadline - self._clock.time()

    async def _attempt(self, seconds: float) -> bool:
        """One ``tryAcquireOrRenew``, abandoned after ``seconds``."""
        if seconds <= 0:
            return False
        return await self._bounded(self._try_acquire_or_renew(), seconds, False)

    async def _bounded(self, work: Coroutine[Any, Any, _T], seconds: float, late: _T) -> _T:
        """``work``'s result, or ``late`` if it takes ``seconds`` or more on the clock."""
        attempt, _ = await first_of(work, self._clock.sleep(seconds))
        if not finished(attempt):
            self._note_error(f"a request to the apiserver took {seconds:.3g}s or more")
            return late
        result: _T = attempt.result()
        return result

    # -- Go's tryAcquireOrRenew and tryRelease -------------------------------------------------

    async def _try_acquire_or_renew(self) -> bool:
        started = self._clock.time()
        now = _wall_now()
        record = LeaderElectionRecord(
            holder_identity=self.identity,
            lease_duration_seconds=self._lease_seconds,
            acquire_time=now,
            renew_time=now,
            leader_transitions=0,
        )
        observed = self._observed
        if observed is not None and self._holds(observed) and self._lease_valid(started):
            mine = dataclasses.replace(
                record,
                acquire_time=observed.acquire_time,
                leader_transitions=observed.leader_transitions,
            )
            if await self._write(self._lock.update, mine, started, quiet=True):
                return True
        try:
            old, raw = await self._lock.get()
        except LeaseNotFoundError:
            return await self._write(self._lock.create, record, started)
        except Exception as error:
            self._note_error(f"cannot read lease {self._lock.describe()}: {error!r}")
            return False
        self._observe(old, raw)
        if _holder(old) is not None and self._lease_valid(started) and not self._holds(old):
            return False
        if self._holds(old):
            record = dataclasses.replace(
                record,
                acquire_time=old.acquire_time,
                leader_transitions=_transitions(old.leader_transitions),
            )
        else:
            record = dataclasses.replace(
                record, leader_transitions=_transitions(old.leader_transitions + 1)
            )
        return await self._write(self._lock.update, record, started)

    async def _write(
        self,
        write: Callable[[LeaderElectionRecord], Awaitable[None]],
        record: LeaderElectionRecord,
        started: float,
        *,
        quiet: bool = False,
    ) -> bool:
        self._wrote = True
        try:
            await write(record)
        except Exception as error:
            if not quiet:
                what = "conflict" if isinstance(error, LeaseConflictError) else repr(error)
                self._note_error(f"cannot write lease {self._lock.describe()}: {what}")
            return False
        self._set_observed(record, None)
        self._renewed_at = started
        self._last_error = None
        if self._term is _Term.CANDIDATE:
            self._start_term()
        return True

    async def _release(self) -> None:
        """Go's ``release``: holder ``""``, a 1 s lease, the transitions kept; retried on conflict
        until ``renew_deadline``. Only a lease the record just read says this candidate holds."""
        self._wrote = False
        deadline = self._clock.time() + self._renew_deadline
        while (remaining := deadline - self._clock.time()) > 0:
            outcome = await self._bounded(self._try_release(), remaining, _Outcome.DONE)
            if outcome is _Outcome.DONE:
                return
        self._log.error("could not release lease %s in time", self._lock.describe())

    async def _try_release(self) -> _Outcome:
        try:
            old, raw = await self._lock.get()
        except LeaseNotFoundError:
            self._log.info("lease %s not found: nothing to release", self._lock.describe())
            return _Outcome.DONE
        except Exception as error:
            self._log.error("cannot read lease %s to release it: %r", self._lock.describe(), error)
            return _Outcome.DONE
        if not self._holds(old):
            self._observe(old, raw)
            return _Outcome.DONE
        now = _wall_now()
        released = LeaderElectionRecord(
            holder_identity="",
            lease_duration_seconds=1,
            acquire_time=now,
            renew_time=now,
            leader_transitions=_transitions(old.leader_transitions),
        )
        try:
            await self._lock.update(released)
        except LeaseConflictError:
            return _Outcome.CONFLICT
        except Exception as error:
            self._log.error("cannot release lease %s: %r", self._lock.describe(), error)
            return _Outcome.DONE
        self._log.info("released lease %s", self._lock.describe())
        self._set_observed(released, None, report=False)
        return _Outcome.DONE

    # -- bookkeeping ---------------------------------------------------------------------------

    def _holds(self, record: LeaderElectionRecord | None) -> bool:
        return record is not None and record.holder_identity == self.identity

    def _lease_valid(self, now: float) -> bool:
        """Go's ``isLeaseValid`` on the record last seen, timed from when this candidate saw it
        change. A duration shorter than ours (a negative or zero one included) is waited out as
        ours."""
        observed = self._observed
        if observed is None:
            return False
        seconds = max(observed.lease_duration_seconds, self._lease_seconds)
        return self._observed_at + seconds > now

    def _observe(self, record: LeaderElectionRecord, raw: bytes) -> None:
        if raw == self._observed_raw:
            return
        self._set_observed(record, raw)
        holder, seconds = _holder(record), record.lease_duration_seconds
        if holder is None or holder == self.identity:
            return
        if seconds <= 0:
            self._log.warning(
                "lease %s held by %r claims leaseDurationSeconds=%d: waited out as %ds",
                self._lock.describe(),
                holder,
                seconds,
                self._lease_seconds,
            )
        elif seconds > IMPLAUSIBLE_LEASE_SECONDS:
            self._log.warning(
                "lease %s held by %r claims leaseDurationSeconds=%d: it is taken only once that "
                "passes without a change to it",
                self._lock.describe(),
                holder,
                seconds,
            )

    def _set_observed(
        self, record: LeaderElectionRecord, raw: bytes | None, *, report: bool = True
    ) -> None:
        """The one place the record last seen changes: a term it ends, and a new holder (Go's
        ``maybeReportTransition``), are logged first."""
        if self._term is _Term.LEADING and not self._holds(record):
            self._end_term(
                logging.WARNING,
                "lost lease %s: the lease is held by %r now",
                self._lock.describe(),
                _holder(record),
            )
        if report:
            self._maybe_report_transition(_holder(record))
        self._observed = record
        self._observed_raw = raw
        self._observed_at = self._clock.time()

    def _maybe_report_transition(self, leader: str | None) -> None:
        if leader == self._reported_leader:
            return
        self._reported_leader = leader
        if leader != self.identity:
            self._log.info("new leader observed on lease %s: %s", self._lock.describe(), leader)

    def _note_error(self, message: str) -> None:
        if message != self._last_error:
            self._last_error = message
            self._log.warning("%s; retrying every %ss", message, self._retry_period)

    def _start_term(self) -> None:
        """Logged, then ``is_leader()`` is true for every caller and the waiters are woken. Go
        logs "successfully acquired lease" in ``acquire``, before ``OnStartedLeading`` runs."""
        self._log.info("successfully acquired lease %s as %s", self._lock.describe(), self.identity)
        self._term = _Term.LEADING
        for waiter in self._leading_waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _end_term(self, level: int, message: str, *args: object) -> None:
        """Ends a term this candidate leads: logged, then ``is_leader()`` is false for every caller
        and ``wait_until_lost()`` returns. Nothing if it does not lead."""
        if self._term is not _Term.LEADING:
            return
        self._log.log(level, message, *args)
        self._term = _Term.ENDED
        self._renewed_at = None
        self._lost.set()


def _holder(record: LeaderElectionRecord | None) -> str | None:
    return (record.holder_identity or None) if record is not None else None


def _transitions(count: int) -> int:
    """A count the apiserver accepts (int32, at least 0): Go's ``int32()`` would wrap past the top
    and the write be refused forever."""
    return min(max(count, 0), INT32_MAX)


def _wall_now() -> datetime:
    return datetime.now(UTC)
