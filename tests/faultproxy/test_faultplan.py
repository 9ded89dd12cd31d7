"""The fault plan alone: filters, schedules and seeded draws, with the clock passed in."""

from __future__ import annotations

import pytest

from fastload.testing.faultplan import FAULT_KINDS, Fault, FaultPlan, RequestInfo, Rule


def request(
    number: int = 1, method: str = "GET", target: str = "/b/k", range_: str | None = None
) -> RequestInfo:
    headers = (("Host", "127.0.0.1:1"),) + ((("Range", range_),) if range_ else ())
    return RequestInfo(number, method, target, headers)


def fired(plan: FaultPlan, requests: list[RequestInfo], now: float = 0.0) -> list[str | None]:
    out = []
    for r in requests:
        active = plan.decide(r, now=now)
        out.append(active.rule.fault.kind if active else None)
    return out


def test_request_info_decodes_the_path_and_finds_headers() -> None:
    info = request(target="/bucket/a%20b/c?partNumber=2", range_="bytes=0-9")
    assert info.path == "/bucket/a b/c"
    assert info.range == info.header("RANGE") == "bytes=0-9"
    assert request().range is None


def test_times_fires_on_the_next_matching_requests_only() -> None:
    plan = FaultPlan()
    active = plan.add(Rule(Fault.slowdown(), method="get", times=2), now=0.0)
    requests = [request(method="HEAD"), request(), request(method="PUT"), request(), request()]
    assert fired(plan, requests) == [None, "slowdown", None, "slowdown", None]
    assert (active.matched, active.fired, active.done) == (3, 2, True)


def test_nth_counts_matching_requests_since_the_rule_was_added() -> None:
    plan = FaultPlan()
    plan.decide(request(), now=0.0)  # before the rule: not counted
    plan.add(Rule(Fault.internal_error(), key="shard-1", nth=[3, 7]), now=0.0)
    keys = ["shard-1", "shard-2"] * 8  # shard-1 is every other request
    kinds = fired(plan, [request(target=f"/b/{k}") for k in keys])
    assert [i for i, kind in enumerate(kinds) if kind] == [4, 12]


def test_has_range_and_where_filter() -> None:
    plan = FaultPlan()
    plan.add(Rule(Fault.ignore_range(), has_range=True, where=lambda r: r.number % 2 == 0), now=0.0)
    requests = [request(1, range_="bytes=0-1"), request(2, range_="bytes=0-1"), request(4)]
    assert fired(plan, requests) == [None, "ignore_range", None]
    plan.clear()
    plan.add(Rule(Fault.slowdown(), has_range=False), now=0.0)
    assert fired(plan, [request(range_="bytes=0-1"), request()]) == [None, "slowdown"]


def test_for_s_is_a_window_starting_when_the_rule_is_added() -> None:
    plan = FaultPlan()
    plan.add(Rule(Fault.slowdown(), for_s=5.0), now=100.0)
    assert [fired(plan, [request()], now=t)[0] for t in (100.0, 104.9, 105.0, 200.0)] == [
        "slowdown",
        "slowdown",
        None,
        None,
    ]


def test_for_s_from_first_is_a_window_starting_at_the_first_matching_request() -> None:
    plan = FaultPlan()
    plan.add(Rule(Fault.slowdown(), method="GET", for_s=5.0, from_first=True), now=100.0)
    assert fired(plan, [request(method="PUT")], now=150.0) == [None]  # not matching: no start
    assert [fired(plan, [request()], now=t)[0] for t in (160.0, 164.9, 165.0, 200.0)] == [
        "slowdown",
        "slowdown",
        None,
        None,
    ]
    with pytest.raises(ValueError, match="from_first=True needs for_s"):
        Rule(Fault.slowdown(), from_first=True)


def test_the_first_rule_that_fires_wins_and_every_matching_rule_counts() -> None:
    plan = FaultPlan()
    first = plan.add(Rule(Fault.slowdown(), nth={2}), now=0.0)
    second = plan.add(Rule(Fault.internal_error(), nth={2, 3}), now=0.0)
    assert fired(plan, [request(), request(), request()]) == [None, "slowdown", "internal_error"]
    assert (first.matched, second.matched, second.fired) == (3, 3, 1)
    plan.remove(first)
    assert plan.rules == (second,)


def test_probability_is_deterministic_per_seed() -> None:
    def run(seed: int) -> list[str | None]:
        plan = FaultPlan(seed=seed)
        plan.add(Rule(Fault.slowdown(), probability=0.3), now=0.0)
        plan.add(Rule(Fault.hang(), probability=0.5), now=0.0)
        return fired(plan, [request(i) for i in range(1000)])

    first = run(42)
    assert first == run(42)
    assert first != run(43)
    assert 250 <= first.count("slowdown") <= 350
    assert 300 <= first.count("hang") <= 400  # half of the remaining 70 %


def test_probability_with_times_caps_the_count() -> None:
    plan = FaultPlan(seed=1)
    plan.add(Rule(Fault.slowdown(), probability=0.5, times=3), now=0.0)
    assert fired(plan, [request(i) for i in range(100)]).count("slowdown") == 3


@pytest.mark.parametrize(
    "make",
    [
        lambda: Rule(Fault.slowdown(), times=0),
        lambda: Rule(Fault.slowdown(), nth=[0, 1]),
        lambda: Rule(Fault.slowdown(), nth=[]),
        lambda: Rule(Fault.slowdown(), for_s=0),
        lambda: Rule(Fault.slowdown(), probability=1.5),
        lambda: Fault.shift_range(shift_bytes=0),
        lambda: Fault.wrong_content_range(shift_bytes=0),
        lambda: Fault.bandwidth(bytes_per_s=0),
        lambda: Fault.latency(delay_s=-1),
        lambda: Fault.reset_mid_body(after_bytes=-1),
        lambda: Fault.hang(duration_s=-1),
    ],
)
def test_bad_values_are_refused(make: object) -> None:
    with pytest.raises(ValueError, match="must"):
        make()  # type: ignore[operator]


def test_every_kind_has_a_constructor() -> None:
    made = {
        Fault.slowdown(),
        Fault.internal_error(),
        Fault.access_denied(),
        Fault.request_timeout(),
        Fault.reset_before_response(),
        Fault.reset_mid_body(),
        Fault.truncate_body(),
        Fault.stall_mid_body(),
        Fault.hang(),
        Fault.ignore_range(),
        Fault.shift_range(shift_bytes=1),
        Fault.wrong_content_range(),
        Fault.latency(delay_s=0.1),
        Fault.bandwidth(bytes_per_s=1),
        Fault.overwrite_before(print),
    }
    assert {f.kind for f in made} == set(FAULT_KINDS)
    with pytest.raises(TypeError):
        Fault.overwrite_before("not callable")  # type: ignore[arg-type]
