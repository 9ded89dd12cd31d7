"""The fault proxy end to end: boto3 -> FaultProxy -> moto server (or a recording upstream), on 127.0.0.1."""

from __future__ import annotations

import http.client
import io
import socket
import threading
import time
from typing import Any

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    IncompleteReadError,
    ReadTimeoutError,
    ResponseStreamingError,
)

from fastload.testing.faultproxy import Fault, FaultProxy, FaultProxyError, RequestInfo, Rule, SigV4Resigner
from fastload.testing.sigv4 import verify_head

from .conftest import BUCKET, SECRET_KEY, RecordingUpstream, s3_client

OK_RESPONSE = b'HTTP/1.1 200 OK\r\nContent-Length: 5\r\nETag: "abc"\r\n\r\n<ok/>'


def error_code(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    err = exc.value.response
    return err["Error"]["Code"], err["ResponseMetadata"]["HTTPStatusCode"]


# -- pass-through ---------------------------------------------------------------------------------------


def test_pass_through_is_byte_identical_and_reuses_connections(
    proxy: FaultProxy, s3: Any, objects: dict[str, bytes]
) -> None:
    data = objects["obj-1m"]
    s3.put_object(Bucket=BUCKET, Key="copy/plain", Body=data)
    s3.put_object(Bucket=BUCKET, Key="copy/expect", Body=io.BytesIO(data))  # Expect: 100-continue
    assert s3.get_object(Bucket=BUCKET, Key="copy/plain")["Body"].read() == data
    assert s3.get_object(Bucket=BUCKET, Key="copy/expect")["Body"].read() == data
    part = s3.get_object(Bucket=BUCKET, Key="obj-1m", Range="bytes=1000-4999")
    assert part["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert part["ContentRange"] == f"bytes 1000-4999/{len(data)}"
    assert part["Body"].read() == data[1000:5000]
    assert s3.head_object(Bucket=BUCKET, Key="obj-1m")["ContentLength"] == len(data)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="copy/")["Contents"]]
    assert keys == ["copy/expect", "copy/plain"]

    stats = proxy.stats()
    assert stats.requests == stats.upstream_requests == 7
    assert stats.connections == 1  # keep-alive although moto answers "Connection: close"
    assert stats.injected == {}
    assert stats.bytes_to_client > 2 * len(data) + 4000
    assert [r.status for r in proxy.requests()] == [200, 200, 200, 200, 206, 200, 200]


def test_forwards_the_request_bytes_unchanged(recording_upstream: type[RecordingUpstream]) -> None:
    upstream = recording_upstream(OK_RESPONSE)
    requests = [
        # odd spacing and case, a duplicate header, a Content-Length body
        b"PUT /b/k%20x?partNumber=1&uploadId=a%2Fb HTTP/1.1\r\nHost: 127.0.0.1:9\r\n"
        b"x-amz-meta-A:  two  spaces \r\nX-Dup: 1\r\nx-dup: 2\r\nContent-Length: 5\r\n\r\nhello",
        # a chunked body with an extension and a trailer, as aws-chunked uploads send
        b"PUT /b/chunked HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;chunk-signature=ab\r\nhello\r\n3\r\n!!!\r\n0\r\nx-amz-checksum-crc32: AAAAAA==\r\n\r\n",
        b"GET /b/k HTTP/1.1\r\nHost: h\r\nRange: bytes=0-1\r\n\r\n",
    ]
    with FaultProxy(upstream.url) as proxy, socket.create_connection(proxy.address, timeout=3) as conn:
        for request in requests:  # all on one client connection
            conn.sendall(request)
            assert _read_response(conn) == OK_RESPONSE
    assert upstream.wait_received(len(requests)) == requests


def _read_response(conn: socket.socket) -> bytes:
    data = b""
    while not (data.endswith(b"<ok/>") or data.endswith(b"\r\n0\r\n\r\n")):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_signatures_verify_on_the_upstream_side(recording_upstream: type[RecordingUpstream]) -> None:
    upstream = recording_upstream(OK_RESPONSE)
    with FaultProxy(upstream.url) as proxy:
        client = s3_client(proxy.endpoint_url)
        client.get_object(Bucket=BUCKET, Key="some/key", Range="bytes=0-1")
        client.put_object(Bucket=BUCKET, Key="some/other key", Body=b"body")
        client.close()
    received = upstream.wait_received(2)
    assert len(received) == 2
    for raw in received:
        head = raw[: raw.index(b"\r\n\r\n") + 4]
        assert f"Host: 127.0.0.1:{proxy.address[1]}".encode() in head  # signed for the proxy, unchanged
        assert verify_head(head, SECRET_KEY)
        assert not verify_head(head, "another-secret")


@pytest.mark.parametrize("resign", [True, False])
def test_rewritten_range_is_signed_again_with_resign(
    recording_upstream: type[RecordingUpstream], resign: bool
) -> None:
    upstream = recording_upstream(OK_RESPONSE)
    with FaultProxy(upstream.url, resign=SigV4Resigner(SECRET_KEY) if resign else None) as proxy:
        proxy.add(Rule(Fault.shift_range(shift_bytes=10)))
        client = s3_client(proxy.endpoint_url)
        client.get_object(Bucket=BUCKET, Key="k", Range="bytes=0-1")
        client.close()
    raw = upstream.wait_received(1)[0]
    head = raw[: raw.index(b"\r\n\r\n") + 4]
    assert b"Range: bytes=10-11\r\n" in head
    assert verify_head(head, SECRET_KEY) is resign


def test_chunked_request_body_reaches_moto(proxy: FaultProxy, s3: Any) -> None:
    conn = http.client.HTTPConnection(*proxy.address, timeout=5)
    try:
        conn.request(
            "PUT", f"/{BUCKET}/chunked-upload", body=iter([b"abc", b"defgh", b"ij"]), encode_chunked=True
        )
        response = conn.getresponse()
        response.read()
        assert response.status == 200
    finally:
        conn.close()
    assert s3.get_object(Bucket=BUCKET, Key="chunked-upload")["Body"].read() == b"abcdefghij"


def test_streams_chunked_and_close_delimited_responses(recording_upstream: type[RecordingUpstream]) -> None:
    chunked = recording_upstream(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n2;x=y\r\nef\r\n0\r\nT: 1\r\n\r\n"
    )
    with FaultProxy(chunked.url) as proxy:
        conn = http.client.HTTPConnection(*proxy.address, timeout=3)
        for _ in range(2):  # the client connection stays usable after a chunked body
            conn.request("GET", "/b/k")
            assert conn.getresponse().read() == b"abcdef"
        conn.close()
        assert proxy.stats().connections == 1
    until_close = recording_upstream(
        b"HTTP/1.1 200 OK\r\nContent-Type: x\r\n\r\n" + b"z" * 100_000, close_after=True
    )
    with FaultProxy(until_close.url) as proxy:
        conn = http.client.HTTPConnection(*proxy.address, timeout=3)
        conn.request("GET", "/b/k")
        assert conn.getresponse().read() == b"z" * 100_000
        conn.close()


# -- error answers ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "code", "status"),
    [
        (Fault.slowdown(), "SlowDown", 503),
        (Fault.internal_error(), "InternalError", 500),
        (Fault.request_timeout(), "RequestTimeout", 400),
    ],
)
def test_error_answers_come_from_the_proxy(
    proxy: FaultProxy, s3: Any, fault: Fault, code: str, status: int
) -> None:
    rule = proxy.add(Rule(fault, method="GET", times=1))
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=BUCKET, Key="small")
    assert error_code(exc) == (code, status)
    assert s3.get_object(Bucket=BUCKET, Key="small")["Body"].read()  # times=1: the next one passes
    stats = proxy.stats()
    assert (stats.requests, stats.upstream_requests, stats.injected) == (2, 1, {fault.kind: 1})
    assert (rule.matched, rule.fired, rule.done) == (2, 1, True)


def test_slowdown_on_a_put_with_expect_continue_does_not_wait_for_the_body(
    proxy: FaultProxy, s3: Any
) -> None:
    proxy.add(Rule(Fault.slowdown(), method="PUT", times=1))
    started = time.monotonic()
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=BUCKET, Key="expect-put", Body=io.BytesIO(b"x" * 100_000))
    assert error_code(exc) == ("SlowDown", 503)
    assert time.monotonic() - started < 0.9  # botocore waits up to 1 s for 100 Continue
    s3.put_object(Bucket=BUCKET, Key="expect-put", Body=io.BytesIO(b"y" * 10))
    assert s3.get_object(Bucket=BUCKET, Key="expect-put")["Body"].read() == b"y" * 10


def test_head_request_gets_an_error_without_body(proxy: FaultProxy, s3: Any) -> None:
    proxy.add(Rule(Fault.slowdown(), times=1))
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=BUCKET, Key="small")
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert s3.head_object(Bucket=BUCKET, Key="small")["ContentLength"] == 1000


# -- broken connections -----------------------------------------------------------------------------------


def test_reset_before_response(proxy: FaultProxy, s3: Any) -> None:
    proxy.add(Rule(Fault.reset_before_response(), times=1))
    with pytest.raises(ConnectionClosedError):
        s3.get_object(Bucket=BUCKET, Key="small")
    assert proxy.stats().upstream_requests == 0
    assert s3.get_object(Bucket=BUCKET, Key="small")["Body"].read()


@pytest.mark.parametrize("kind", ["reset_mid_body", "truncate_body"])
def test_broken_body(proxy: FaultProxy, s3: Any, objects: dict[str, bytes], kind: str) -> None:
    fault = (
        Fault.reset_mid_body(after_bytes=5000)
        if kind == "reset_mid_body"
        else Fault.truncate_body(after_bytes=5000)
    )
    proxy.add(Rule(fault, times=1))
    response = s3.get_object(Bucket=BUCKET, Key="obj-1m")
    assert response["ContentLength"] == len(objects["obj-1m"])  # the head promised the whole object
    with pytest.raises((ResponseStreamingError, IncompleteReadError)):
        response["Body"].read()
    assert proxy.stats().injected == {kind: 1}
    assert s3.get_object(Bucket=BUCKET, Key="small")["Body"].read() == objects["small"]


def test_stall_mid_body_makes_the_client_time_out(proxy: FaultProxy, objects: dict[str, bytes]) -> None:
    client = s3_client(proxy.endpoint_url, read_timeout=1)
    proxy.add(Rule(Fault.stall_mid_body(after_bytes=100, duration_s=30), times=1))
    response = client.get_object(Bucket=BUCKET, Key="small")
    started = time.monotonic()
    with pytest.raises(ReadTimeoutError):
        response["Body"].read()
    assert 0.9 < time.monotonic() - started < 3
    assert client.get_object(Bucket=BUCKET, Key="small")["Body"].read() == objects["small"]
    client.close()


def test_hang_makes_the_client_time_out(proxy: FaultProxy) -> None:
    client = s3_client(proxy.endpoint_url, read_timeout=1)
    proxy.add(Rule(Fault.hang(duration_s=30), times=1))
    started = time.monotonic()
    with pytest.raises(ReadTimeoutError):
        client.get_object(Bucket=BUCKET, Key="small")
    assert 0.9 < time.monotonic() - started < 3
    assert proxy.stats().injected == {"hang": 1}
    client.close()


# -- wrong answers ----------------------------------------------------------------------------------------


def test_ignore_range_returns_the_whole_object(proxy: FaultProxy, s3: Any, objects: dict[str, bytes]) -> None:
    proxy.add(Rule(Fault.ignore_range(), has_range=True))
    response = s3.get_object(Bucket=BUCKET, Key="obj-1m", Range="bytes=100-199")
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert "ContentRange" not in response
    assert response["Body"].read() == objects["obj-1m"]


def test_shift_range_answers_another_range(proxy: FaultProxy, s3: Any, objects: dict[str, bytes]) -> None:
    proxy.add(Rule(Fault.shift_range(shift_bytes=10)))
    response = s3.get_object(Bucket=BUCKET, Key="obj-1m", Range="bytes=100-199")
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert response["ContentRange"] == f"bytes 110-209/{1 << 20}"
    assert response["Body"].read() == objects["obj-1m"][110:210]
    assert proxy.requests()[0].range == "bytes=100-199"  # what the client asked for


def test_wrong_content_range_keeps_the_body(proxy: FaultProxy, s3: Any, objects: dict[str, bytes]) -> None:
    proxy.add(Rule(Fault.wrong_content_range(shift_bytes=-100)))
    response = s3.get_object(Bucket=BUCKET, Key="obj-1m", Range="bytes=100-199")
    assert response["ContentRange"] == f"bytes 0-99/{1 << 20}"
    assert response["Body"].read() == objects["obj-1m"][100:200]
    assert proxy.stats().injected == {"wrong_content_range": 1}


def test_overwrite_before_changes_the_object_between_ranges(
    proxy: FaultProxy, s3: Any, moto_url: str, objects: dict[str, bytes]
) -> None:
    direct = s3_client(moto_url)
    direct.put_object(Bucket=BUCKET, Key="mutable", Body=b"a" * 1000)
    seen: list[RequestInfo] = []

    def overwrite(request: RequestInfo) -> None:
        seen.append(request)
        direct.put_object(Bucket=BUCKET, Key="mutable", Body=b"b" * 1000)

    first = s3.get_object(Bucket=BUCKET, Key="mutable", Range="bytes=0-99")
    assert first["Body"].read() == b"a" * 100
    proxy.add(Rule(Fault.overwrite_before(overwrite), key="mutable", has_range=True, times=1))
    second = s3.get_object(Bucket=BUCKET, Key="mutable", Range="bytes=100-199")
    assert second["Body"].read() == b"b" * 100
    assert second["ETag"] != first["ETag"]
    assert [(r.method, r.path, r.range) for r in seen] == [("GET", f"/{BUCKET}/mutable", "bytes=100-199")]
    direct.close()


def test_failing_callback_is_raised_by_close(moto_url: str, objects: dict[str, bytes]) -> None:
    def boom(request: RequestInfo) -> None:
        raise KeyError("boom")

    proxy = FaultProxy(moto_url).start()
    proxy.add(Rule(Fault.overwrite_before(boom)))
    client = s3_client(proxy.endpoint_url)
    with pytest.raises(ClientError) as exc:
        client.get_object(Bucket=BUCKET, Key="small")
    assert error_code(exc) == ("ProxyCallbackFailed", 502)
    client.close()
    with pytest.raises(FaultProxyError) as failed:
        proxy.close()
    assert isinstance(failed.value.errors[0], KeyError)


def test_failing_where_predicate_is_raised_by_close(moto_url: str, objects: dict[str, bytes]) -> None:
    proxy = FaultProxy(moto_url).start()
    proxy.add(Rule(Fault.slowdown(), where=lambda request: 1 / 0 > 0))
    client = s3_client(proxy.endpoint_url)
    with pytest.raises(ClientError) as exc:
        client.get_object(Bucket=BUCKET, Key="small")
    assert error_code(exc) == ("ProxyRuleFailed", 502)
    proxy.clear()
    assert client.get_object(Bucket=BUCKET, Key="small")["Body"].read()
    assert [r.status for r in proxy.requests()] == [502, 200]
    client.close()
    with pytest.raises(FaultProxyError, match="ZeroDivisionError"):
        proxy.close()


# -- slow answers -----------------------------------------------------------------------------------------


def test_latency_delays_the_first_byte(proxy: FaultProxy, s3: Any) -> None:
    proxy.add(Rule(Fault.latency(delay_s=0.5)))
    started = time.monotonic()
    s3.get_object(Bucket=BUCKET, Key="small")["Body"].read()
    assert 0.5 <= time.monotonic() - started < 1.5


def test_bandwidth_caps_the_body_rate(proxy: FaultProxy, s3: Any, objects: dict[str, bytes]) -> None:
    proxy.add(Rule(Fault.bandwidth(bytes_per_s=2 << 20)))
    started = time.monotonic()
    body = s3.get_object(Bucket=BUCKET, Key="obj-2m")["Body"].read()
    elapsed = time.monotonic() - started
    assert body == objects["obj-2m"]
    assert 0.5 <= elapsed <= 3.0  # 2 MiB at 2 MiB/s: about 1 s


# -- schedules --------------------------------------------------------------------------------------------


def _outcomes(s3: Any, count: int, **kwargs: Any) -> list[str]:
    results = []
    for _ in range(count):
        try:
            s3.get_object(Bucket=BUCKET, Key="small", **kwargs)["Body"].read()
            results.append("ok")
        except ClientError as exc:
            results.append(exc.response["Error"]["Code"])
    return results


def test_nth_matching_requests(proxy: FaultProxy, s3: Any) -> None:
    proxy.add(Rule(Fault.internal_error(), method="GET", nth={3, 7}))
    s3.head_object(Bucket=BUCKET, Key="small")  # not a GET: not counted
    assert _outcomes(s3, 8) == ["ok", "ok", "InternalError", "ok", "ok", "ok", "InternalError", "ok"]
    assert [r.fault for r in proxy.requests()].count("internal_error") == 2


def test_filters_on_key_and_range(proxy: FaultProxy, s3: Any) -> None:
    proxy.add(Rule(Fault.slowdown(), key="obj-1m", has_range=True))
    assert s3.get_object(Bucket=BUCKET, Key="obj-1m")["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert s3.get_object(Bucket=BUCKET, Key="small", Range="bytes=0-9")["Body"].read()
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=BUCKET, Key="obj-1m", Range="bytes=0-9")
    assert error_code(exc) == ("SlowDown", 503)


def test_storm_lasts_for_its_window(proxy: FaultProxy, s3: Any) -> None:
    added = time.monotonic()
    proxy.add(Rule(Fault.slowdown(), for_s=1.0))
    assert _outcomes(s3, 3) == ["SlowDown"] * 3
    time.sleep(max(0.0, added + 1.1 - time.monotonic()))
    assert _outcomes(s3, 2) == ["ok", "ok"]


def test_the_first_rule_that_fires_wins(proxy: FaultProxy, s3: Any) -> None:
    proxy.add(Rule(Fault.slowdown(), times=1))
    proxy.add(Rule(Fault.internal_error(), times=2))
    assert _outcomes(s3, 4) == ["SlowDown", "InternalError", "InternalError", "ok"]
    proxy.add(Rule(Fault.internal_error()))
    proxy.clear()
    assert _outcomes(s3, 1) == ["ok"]


def _random_run(moto_url: str, seed: int) -> tuple[list[str], list[str | None]]:
    with FaultProxy(moto_url, seed=seed) as proxy:
        proxy.add(Rule(Fault.slowdown(), probability=0.3))
        proxy.add(Rule(Fault.internal_error(), probability=0.2))
        client = s3_client(proxy.endpoint_url)
        outcomes = _outcomes(client, 20)
        client.close()
        return outcomes, [r.fault for r in proxy.requests()]


def test_seeded_probability_gives_the_same_fault_sequence(moto_url: str, objects: dict[str, bytes]) -> None:
    first, again, other = (_random_run(moto_url, seed) for seed in (7, 7, 8))
    assert first == again
    assert first != other
    assert {"ok", "SlowDown", "InternalError"} <= set(first[0])


# -- robustness -------------------------------------------------------------------------------------------


def test_close_is_quick_with_hanging_slow_and_idle_connections(
    moto_url: str, objects: dict[str, bytes]
) -> None:
    proxy = FaultProxy(moto_url).start()
    idle = s3_client(proxy.endpoint_url)
    idle.head_object(Bucket=BUCKET, Key="small")  # leaves a keep-alive connection open
    proxy.add(Rule(Fault.hang(duration_s=60), key="small"))
    proxy.add(Rule(Fault.bandwidth(bytes_per_s=100_000), key="obj-1m"))
    errors: list[BaseException] = []

    def fetch(key: str) -> None:
        client = s3_client(proxy.endpoint_url, read_timeout=30)
        try:
            client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        except Exception as exc:
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=fetch, args=(key,)) for key in ("small", "obj-1m")]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while proxy.stats().requests < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    started = time.monotonic()
    proxy.close()
    assert time.monotonic() - started < 1.2
    for thread in threads:
        thread.join(timeout=5)
    assert len(errors) == 2  # both clients saw their connection end
    assert not proxy.errors
    assert not [t for t in threading.enumerate() if t.name.startswith("faultproxy")]
    idle.close()


def test_client_disconnect_mid_body_is_not_an_error(proxy: FaultProxy, s3: Any) -> None:
    url = s3.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": "obj-1m"})
    target = url.removeprefix(proxy.endpoint_url)
    proxy.add(Rule(Fault.bandwidth(bytes_per_s=500_000)))
    with socket.create_connection(proxy.address, timeout=3) as conn:
        conn.sendall(f"GET {target} HTTP/1.1\r\nHost: {proxy.address[0]}:{proxy.address[1]}\r\n\r\n".encode())
        assert conn.recv(100).startswith(b"HTTP/1.1 200")
    time.sleep(0.2)
    assert proxy.stats().bytes_to_client < 500_000
    assert not proxy.errors


def test_bad_request_line_gets_400(proxy: FaultProxy) -> None:
    with socket.create_connection(proxy.address, timeout=3) as conn:
        conn.sendall(b"NOT HTTP\r\n\r\n")
        assert conn.recv(100).startswith(b"HTTP/1.1 400")


def test_upstream_down_gives_502(objects: dict[str, bytes]) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with FaultProxy(("127.0.0.1", port)) as proxy:
        client = s3_client(proxy.endpoint_url)
        with pytest.raises(ClientError) as exc:
            client.get_object(Bucket=BUCKET, Key="small")
        assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 502
        assert proxy.stats().upstream_errors == 1
        client.close()


def test_only_loopback_upstreams() -> None:
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("http://10.0.0.1:9000")
    with pytest.raises(ValueError, match=r"http://127\.0\.0\.1:PORT"):
        FaultProxy("https://127.0.0.1:9000")
