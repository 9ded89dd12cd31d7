"""A seek cancels read-ahead it made useless; closing a reader stops its requests."""

from __future__ import annotations

import io
import time
from collections.abc import Callable

import fastload
from fastload.testing.faultproxy import Fault, FaultProxy, Rule

from .helpers import bounded, gets, parse_range, reader_threads, url, wait_until

KEY = "obj-3m"
SMALL_PART = 64 << 10


def test_seek_to_the_end_skips_the_middle(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], objects: dict[str, bytes]
) -> None:
    data = objects[KEY]
    parts = len(data) // SMALL_PART
    assert parts == 48
    # a read-ahead window of 8 parts, 2 requests at a time: most of the window is still queued at the seek
    config = make_config(proxy, part_size_bytes=SMALL_PART, max_concurrency=2, readahead_bytes=8 * SMALL_PART)
    assert config.readahead_parts == 8
    proxy.add(Rule(Fault.latency(delay_s=0.1), method="GET", key=KEY))
    tail_at = len(data) - 100_000

    def first_then_tail() -> tuple[bytes, bytes]:
        with fastload.open(url(KEY), config=config) as f:
            first = f.read(SMALL_PART)
            f.seek(tail_at)
            return first, f.read()

    first, tail = bounded(first_then_tail)
    assert first == data[:SMALL_PART]
    assert tail == data[tail_at:]
    wait_until(lambda: not reader_threads(), 3)
    starts = sorted(parse_range(r.range or "")[0] // SMALL_PART for r in gets(proxy, KEY))
    tail_parts = set(range(tail_at // SMALL_PART, parts))
    middle = [i for i in starts if i not in tail_parts and i > 2]
    # part 0, at most the 2 parts already running at the seek, the tail; none of the queued 3..7
    assert middle == [], starts
    assert len(starts) <= 3 + len(tail_parts), starts
    assert len(starts) < parts // 4


def test_read_ahead_stops_at_the_window(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], objects: dict[str, bytes]
) -> None:
    """docs/s3.md: at most ``readahead_bytes`` is fetched ahead of the read position."""
    data = objects[KEY]
    config = make_config(proxy, part_size_bytes=SMALL_PART, readahead_bytes=3 * SMALL_PART)

    def read_slowly() -> tuple[bytes, list[int]]:
        asked = []
        with fastload.open(url(KEY), config=config) as f:
            first = f.read(10)
            for _ in range(5):
                time.sleep(0.1)  # time enough to fetch far more than the window, if it were allowed
                asked.append(len(gets(proxy, KEY)))
            f.seek(5 * SMALL_PART + 1)
            f.read(10)
            time.sleep(0.3)
            asked.append(len(gets(proxy, KEY)))
        return first, asked

    first, asked = bounded(read_slowly)
    assert first == data[:10]
    assert asked[:5] == [config.readahead_parts] * 5
    assert asked[5] == config.readahead_parts * 2  # parts 5, 6, 7 after the seek


def test_seek_back_and_forth_reads_right_bytes_with_bounded_requests(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], objects: dict[str, bytes]
) -> None:
    data = objects[KEY]
    config = make_config(proxy, part_size_bytes=SMALL_PART)
    offsets = [0, len(data) // 2, 10, len(data) - 5, len(data) // 3, SMALL_PART * 7 - 1]

    def hop() -> list[bytes]:
        out = []
        with fastload.open(url(KEY), config=config) as f:
            for offset in offsets:
                f.seek(offset, io.SEEK_SET)
                out.append(f.read(1000))
        return out

    assert bounded(hop) == [data[o : o + 1000] for o in offsets]
    # each hop needs one or two parts and schedules at most one read-ahead window
    assert len(gets(proxy, KEY)) <= len(offsets) * config.readahead_parts


def test_close_stops_requests_of_a_struggling_reader(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config]
) -> None:
    """A reader closed while its read-ahead parts are being retried (the store throttles) must stop asking
    the store: STYLE.md, "every pool has one owner, bounded in-flight work, a stop event, ... close()"."""
    config = make_config(proxy, part_size_bytes=SMALL_PART, deadline_s=2.5, max_attempts=1000)
    # every GET but the first part's is throttled: the read-ahead parts keep failing and retrying
    proxy.add(
        Rule(Fault.slowdown(), method="GET", key=KEY, where=lambda r: r.range != f"bytes=0-{SMALL_PART - 1}")
    )
    f = fastload.open(url(KEY), config=config)
    bounded(lambda: f.read(1000))
    time.sleep(0.2)
    assert fastload.s3_stats()["throttles"] > 0  # the read-ahead is retrying now
    f.close()
    time.sleep(0.3)  # a request already on the wire may finish
    at_close = len(gets(proxy, KEY))
    time.sleep(1.0)
    later = len(gets(proxy, KEY)) - at_close
    assert later == 0, f"{later} requests in the second after close()"
    assert wait_until(lambda: not reader_threads(), 1.0), reader_threads()


def test_seek_stops_retrying_parts_it_made_useless(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], objects: dict[str, bytes]
) -> None:
    """docs/s3.md: "a seek cancels parts it made useless". Parts already running when the seek comes may
    finish their current request, but must not go on retrying for the rest of the deadline."""
    data = objects[KEY]
    config = make_config(proxy, part_size_bytes=SMALL_PART, deadline_s=2.5, max_attempts=1000)
    middle = (SMALL_PART, 10 * SMALL_PART)  # every request in here is throttled

    def in_middle(request: object) -> bool:
        value = getattr(request, "range", None)
        return value is not None and middle[0] <= parse_range(value)[0] < middle[1]

    proxy.add(Rule(Fault.slowdown(), method="GET", key=KEY, where=in_middle))
    tail_at = len(data) - 5000

    def first_then_tail() -> tuple[bytes, bytes]:
        with fastload.open(url(KEY), config=config) as f:
            first = f.read(1000)  # schedules parts 1..3, which get throttled
            time.sleep(0.3)
            f.seek(tail_at)
            tail = f.read()
            time.sleep(0.3)
            asked_after_tail = len(gets(proxy, KEY))
            time.sleep(1.0)
            return first + tail, len(gets(proxy, KEY)) - asked_after_tail

    got, later = bounded(first_then_tail)
    assert got == data[:1000] + data[tail_at:]
    assert later == 0, f"{later} requests for abandoned parts in the second after the seek"
