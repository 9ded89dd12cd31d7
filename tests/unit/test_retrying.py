"""The retry loop: real botocore exceptions, a fake clock and sleep, and the process gate's slots."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import botocore.exceptions
import pytest

from fastload.core.retry import Fault, RetryPolicy
from fastload.s3.client import Failure
from fastload.s3.gate import ConcurrencyGate
from fastload.s3.retrying import BadResponse, Retrier

ATTEMPT_S = 0.02


def client_error(status: int, code: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "GetObject",
    )


def slow_down() -> botocore.exceptions.ClientError:
    return client_error(503, "SlowDown")


class RecordingGate(ConcurrencyGate):
    """A real gate that also records the in-flight count it sees and the flags of every release."""

    def __init__(self, max_limit: int) -> None:
        super().__init__(max_limit)
        self.in_flight = 0
        self.acquires = 0
        self.releases: list[tuple[bool, bool]] = []

    def acquire(self) -> None:
        super().acquire()
        self.in_flight += 1
        self.acquires += 1

    def release(self, *, throttled: bool = False, succeeded: bool = False) -> None:
        self.in_flight -= 1
        self.releases.append((throttled, succeeded))
        super().release(throttled=throttled, succeeded=succeeded)


@dataclass
class FakeTime:
    """A clock that advances only when slept on (and by ``ATTEMPT_S`` per attempt, via ``tick``)."""

    now: float = 1000.0
    sleeps: list[float] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds

    def tick(self, seconds: float = ATTEMPT_S) -> None:
        self.now += seconds


@dataclass
class Script:
    """An attempt that raises the scripted exceptions in turn, then returns ``result``."""

    outcomes: list[BaseException]
    time: FakeTime
    gate: RecordingGate
    result: Any = "payload"
    calls: int = 0
    in_flight_seen: list[int] = field(default_factory=list)

    def __call__(self) -> Any:
        self.calls += 1
        self.in_flight_seen.append(self.gate.in_flight)
        self.time.tick()
        if self.outcomes:
            raise self.outcomes.pop(0)
        return self.result


class GiveUp(Exception):
    def __init__(self, failure: Failure, tries: int, elapsed_s: float) -> None:
        super().__init__(f"gave up after {tries} tries: {failure.message}")
        self.failure = failure
        self.tries = tries
        self.elapsed_s = elapsed_s


@dataclass
class GiveUpRecorder:
    calls: list[GiveUp] = field(default_factory=list)

    def __call__(self, failure: Failure, tries: int, elapsed_s: float) -> Exception:
        err = GiveUp(failure, tries, elapsed_s)
        self.calls.append(err)
        return err


def setup(
    outcomes: Iterable[BaseException], *, policy: RetryPolicy | None = None, max_limit: int = 8
) -> tuple[Retrier, Script, FakeTime, RecordingGate, GiveUpRecorder]:
    fake = FakeTime()
    gate = RecordingGate(max_limit)
    retrier = Retrier(
        policy or RetryPolicy(),
        gate,
        rng=random.Random(1234),
        sleep=fake.sleep,
        clock=fake.clock,
    )
    return retrier, Script(list(outcomes), fake, gate), fake, gate, GiveUpRecorder()


def assert_slots_free(gate: ConcurrencyGate, slots: int) -> None:
    """Take ``slots`` slots from another thread; a leaked slot would block it, so wait with a timeout."""
    got = threading.Event()

    def take() -> None:
        for _ in range(slots):
            gate.acquire()
        got.set()

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    assert got.wait(3.0), f"could not take {slots} slots of the gate: a slot leaked"
    for _ in range(slots):
        gate.release()


# --- success after retries ---------------------------------------------------------------------------


def test_retries_retryable_faults_then_returns_the_success() -> None:
    faults: list[BaseException] = [
        slow_down(),
        botocore.exceptions.ReadTimeoutError(endpoint_url="http://x"),
        botocore.exceptions.ConnectionClosedError(endpoint_url="http://x"),
        BadResponse(Failure(Fault.SHORT_BODY, 206, "body ended after 3 of 10 bytes")),
        BadResponse(Failure(Fault.BAD_RANGE, 206, "wrong Content-Range")),
        client_error(500, "InternalError"),
        client_error(400, "RequestTimeout"),
    ]
    retrier, attempt, fake, gate, give_up = setup(faults)
    assert retrier.call(attempt, give_up) == "payload"
    assert attempt.calls == 8
    assert give_up.calls == []
    # One full-jitter wait between attempts, each within its cap (50 ms doubling).
    assert len(fake.sleeps) == 7
    for n, delay in enumerate(fake.sleeps, start=1):
        assert 0.0 <= delay <= 0.05 * 2 ** (n - 1)
    # Every attempt holds exactly one slot; the waits hold none; all slots are back at the end.
    assert attempt.in_flight_seen == [1] * 8
    assert gate.in_flight == 0
    assert gate.acquires == 8
    assert gate.releases[-1] == (False, True)
    assert_slots_free(gate, gate.limit)


def test_waits_are_not_spent_holding_a_slot() -> None:
    retrier, attempt, fake, gate, give_up = setup([slow_down()] * 3)
    seen_while_sleeping: list[int] = []
    inner = fake.sleep

    def sleep(seconds: float) -> None:
        seen_while_sleeping.append(gate.in_flight)
        inner(seconds)

    retrier.sleep = sleep
    assert retrier.call(attempt, give_up) == "payload"
    assert seen_while_sleeping == [0, 0, 0]


def test_success_on_first_try_does_not_sleep() -> None:
    retrier, attempt, fake, gate, give_up = setup([])
    assert retrier.call(attempt, give_up) == "payload"
    assert attempt.calls == 1
    assert fake.sleeps == []
    assert gate.in_flight == 0
    assert_slots_free(gate, 8)


# --- fail fast ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code", "fault"),
    [
        (404, "NoSuchKey", Fault.NOT_FOUND),
        (404, "NoSuchBucket", Fault.NOT_FOUND),
        (403, "AccessDenied", Fault.DENIED),
        (412, "PreconditionFailed", Fault.CHANGED),
        (400, "InvalidArgument", Fault.CLIENT),
    ],
)
def test_fails_fast_on_4xx(status: int, code: str, fault: Fault) -> None:
    retrier, attempt, fake, gate, give_up = setup([client_error(status, code)])
    with pytest.raises(GiveUp) as info:
        retrier.call(attempt, give_up)
    assert len(give_up.calls) == 1
    assert info.value is give_up.calls[0]
    assert info.value.failure.fault is fault
    assert info.value.failure.status == status
    assert code in info.value.failure.message
    assert info.value.tries == 1
    assert info.value.elapsed_s == pytest.approx(ATTEMPT_S)
    assert attempt.calls == 1
    assert fake.sleeps == []
    assert gate.in_flight == 0
    assert_slots_free(gate, 8)


def test_bad_response_failure_reaches_give_up_unchanged() -> None:
    failure = Failure(Fault.CHANGED, 412, "etag moved")
    retrier, attempt, _, gate, give_up = setup([BadResponse(failure)])
    with pytest.raises(GiveUp) as info:
        retrier.call(attempt, give_up)
    assert info.value.failure is failure
    assert attempt.calls == 1
    assert gate.in_flight == 0


# --- budget spent ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        slow_down,
        lambda: botocore.exceptions.ReadTimeoutError(endpoint_url="http://x"),
        lambda: botocore.exceptions.ConnectionClosedError(endpoint_url="http://x"),
        lambda: BadResponse(Failure(Fault.SHORT_BODY, 206, "short")),
    ],
)
def test_gives_up_when_attempts_run_out(make: Callable[[], BaseException]) -> None:
    policy = RetryPolicy(max_attempts=4, deadline_s=1e6)
    retrier, attempt, fake, gate, give_up = setup([make() for _ in range(10)], policy=policy)
    with pytest.raises(GiveUp) as info:
        retrier.call(attempt, give_up)
    assert len(give_up.calls) == 1
    assert info.value.tries == 4
    assert attempt.calls == 4
    assert len(fake.sleeps) == 3
    assert info.value.elapsed_s == pytest.approx(4 * ATTEMPT_S + sum(fake.sleeps))
    assert gate.in_flight == 0
    assert_slots_free(gate, gate.limit)


def test_gives_up_by_the_deadline() -> None:
    policy = RetryPolicy(max_attempts=10_000, base_backoff_s=0.5, max_backoff_s=0.5, deadline_s=5.0)
    retrier, attempt, fake, gate, give_up = setup([slow_down() for _ in range(10_000)], policy=policy)
    began = fake.now
    with pytest.raises(GiveUp) as info:
        retrier.call(attempt, give_up)
    assert info.value.tries == attempt.calls < 10_000
    assert info.value.elapsed_s == pytest.approx(fake.now - began)
    assert 5.0 - 0.5 <= info.value.elapsed_s < 5.0 + ATTEMPT_S
    assert gate.in_flight == 0


def test_rides_out_a_storm_with_the_default_policy() -> None:
    # 503 for every attempt that starts in the first 5 s, through the real loop.
    for seed in range(20):
        fake = FakeTime()
        gate = RecordingGate(8)
        retrier = Retrier(RetryPolicy(), gate, rng=random.Random(seed), sleep=fake.sleep, clock=fake.clock)
        began = fake.now

        def attempt(fake: FakeTime = fake, began: float = began) -> str:
            started = fake.now
            fake.tick()
            if started - began < 5.0:
                raise slow_down()
            return "through"

        assert retrier.call(attempt, GiveUpRecorder()) == "through"
        assert gate.in_flight == 0


# --- not ours: pass through --------------------------------------------------------------------------


@pytest.mark.parametrize("exc", [KeyError("k"), ValueError("v"), RuntimeError("r")])
def test_other_exceptions_pass_through_unchanged(exc: Exception) -> None:
    retrier, attempt, fake, gate, give_up = setup([exc])
    with pytest.raises(type(exc)) as info:
        retrier.call(attempt, give_up)
    assert info.value is exc
    assert attempt.calls == 1
    assert give_up.calls == []
    assert fake.sleeps == []
    assert gate.in_flight == 0
    assert gate.releases == [(False, False)]
    assert gate.limit == 8
    assert_slots_free(gate, 8)


def test_passthrough_after_retries_frees_the_slot() -> None:
    retrier, attempt, _, gate, give_up = setup([slow_down(), KeyError("late")])
    with pytest.raises(KeyError):
        retrier.call(attempt, give_up)
    assert attempt.calls == 2
    assert gate.in_flight == 0
    assert_slots_free(gate, gate.limit)


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3)])
def test_interrupt_during_an_attempt_frees_the_slot(exc: BaseException) -> None:
    # The gate is process-wide: a slot lost to a Ctrl-C (caught, e.g. by a notebook) is lost for good,
    # and max_limit of them make every later read hang.
    retrier, attempt, _, gate, give_up = setup([exc], max_limit=2)
    with pytest.raises(type(exc)):
        retrier.call(attempt, give_up)
    assert gate.in_flight == 0, "the attempt's gate slot was not released"
    assert_slots_free(gate, 2)


# --- the gate's limit --------------------------------------------------------------------------------


def test_throttles_lower_the_gate_limit() -> None:
    retrier, attempt, _, gate, give_up = setup([slow_down()], max_limit=8)
    assert retrier.call(attempt, give_up) == "payload"
    assert gate.releases == [(True, False), (False, True)]
    assert gate.limit == 4  # halved by the 503, +1/4 from the success
    assert_slots_free(gate, 4)


def test_throttle_bad_response_lowers_the_gate_limit() -> None:
    failure = Failure(Fault.THROTTLE, 503, "SlowDown")
    retrier, attempt, _, gate, give_up = setup([BadResponse(failure)], max_limit=8)
    assert retrier.call(attempt, give_up) == "payload"
    assert gate.limit == 4


def test_other_faults_do_not_lower_the_gate_limit() -> None:
    faults: list[BaseException] = [
        client_error(500, "InternalError"),
        botocore.exceptions.ReadTimeoutError(endpoint_url="http://x"),
        botocore.exceptions.ConnectionClosedError(endpoint_url="http://x"),
        BadResponse(Failure(Fault.BAD_RANGE, 206, "wrong range")),
    ]
    retrier, attempt, _, gate, give_up = setup(faults, max_limit=8)
    assert retrier.call(attempt, give_up) == "payload"
    assert [t for t, _ in gate.releases] == [False] * 5
    assert gate.limit == 8


def test_gave_up_throttle_still_lowers_the_limit() -> None:
    policy = RetryPolicy(max_attempts=1)
    retrier, attempt, _, gate, give_up = setup([slow_down()], policy=policy, max_limit=8)
    with pytest.raises(GiveUp):
        retrier.call(attempt, give_up)
    assert gate.limit == 4
    assert gate.in_flight == 0
    assert_slots_free(gate, 4)


# --- an endpoint that never answered (issue 28 item 9) -----------------------------------------------


def refused() -> botocore.exceptions.EndpointConnectionError:
    return botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:9/b/k")


def test_a_refused_endpoint_that_never_answered_fails_within_seconds() -> None:
    retrier, attempt, fake, _, give_up = setup([refused()] * 40)
    retrier.endpoint = "http://127.0.0.1:9"
    began = fake.now
    with pytest.raises(GiveUp) as info:
        retrier.call(attempt, give_up)
    assert fake.now - began < RetryPolicy().unreachable_deadline_s + 0.5
    assert info.value.failure.fault is Fault.UNREACHABLE
    assert "http://127.0.0.1:9" in info.value.failure.message
    assert "AWS_ENDPOINT_URL" in info.value.failure.message
    assert "http://127.0.0.1:9" not in retrier.answered


def test_a_refused_endpoint_that_answered_before_is_retried_in_full() -> None:
    """A success (or any HTTP response) marks the endpoint: a later refusal (a restart) is ridden out."""
    retrier, attempt, fake, _, give_up = setup([client_error(404, "NoSuchKey")])
    retrier.endpoint = "http://127.0.0.1:9"
    with pytest.raises(GiveUp):
        retrier.call(attempt, give_up)  # a 404 is an answer
    assert retrier.answered == {"http://127.0.0.1:9"}
    attempt.outcomes = [refused()] * 12
    began = fake.now
    assert retrier.call(attempt, give_up) == "payload"
    assert fake.now - began > RetryPolicy().unreachable_deadline_s
