"""core.sigv4 signs exactly as botocore's S3SigV4Auth does (the direct transport's requests are checked by
a real SigV4 verifier in tests/s3; here the headers are compared one for one over many requests)."""

from __future__ import annotations

import datetime
from typing import Any

import boto3
import botocore.auth
import botocore.awsrequest
import botocore.config
import botocore.credentials
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.core import sigv4
from fastload.s3 import client

KEY_CHARS = st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"))


def botocore_headers(
    method: str, url: str, headers: dict[str, str], creds: botocore.credentials.Credentials, region: str
) -> dict[str, str]:
    request = botocore.awsrequest.AWSRequest(method=method, url=url, headers=dict(headers))
    botocore.auth.S3SigV4Auth(creds.get_frozen_credentials(), "s3", region).add_auth(request)
    return dict(request.headers.items())


@settings(max_examples=40, deadline=None)
@given(
    key=st.text(KEY_CHARS, min_size=1, max_size=30),
    query=st.sampled_from(["", "versionId=3%2Fa", "versionId=x&partNumber=2", "a=2&a=1&b"]),
    host=st.sampled_from(
        ["http://127.0.0.1:9000", "https://b.s3.eu-west-1.amazonaws.com", "http://[::1]:80", "https://h:443"]
    ),
    headers=st.dictionaries(
        st.sampled_from(["Range", "If-Match", "User-Agent", "x-amz-request-payer", "Authorization"]),
        st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=20),
        max_size=4,
    ),
    token=st.one_of(st.none(), st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1)),
    method=st.sampled_from(["GET", "HEAD"]),
    region=st.sampled_from(["us-east-1", "eu-west-1"]),
)
def test_the_headers_are_botocores(
    key: str, query: str, host: str, headers: dict[str, str], token: str | None, method: str, region: str
) -> None:
    path = "/bucket/" + botocore.utils.percent_encode(key, safe="/~")
    url = host + path + (f"?{query}" if query else "")
    creds = botocore.credentials.Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    theirs = botocore_headers(method, url, headers, creds, region)
    stamp = datetime.datetime.strptime(theirs["X-Amz-Date"], "%Y%m%dT%H%M%SZ")
    ours = sigv4.sign(
        method,
        url,
        headers,
        access_key=creds.access_key,
        secret_key=creds.secret_key,
        token=token,
        region=region,
        now=stamp,
    )
    assert ours == theirs


def test_the_signing_key_of_a_day_is_derived_once() -> None:
    sigv4.signing_key.cache_clear()
    now = datetime.datetime(2024, 5, 1, 12, 0, 0)
    for second in range(3):
        sigv4.sign(
            "GET",
            "http://h:1/b/k",
            {"Range": "bytes=0-1"},
            access_key="A",
            secret_key="S",
            token=None,
            region="r",
            now=now.replace(second=second),
        )
    info = sigv4.signing_key.cache_info()
    assert (info.misses, info.hits) == (1, 2)


def _clients() -> list[tuple[Any, str]]:
    made = []
    for style, endpoint, bucket in (
        ("path", "http://127.0.0.1:9000", "bench"),
        ("virtual", None, "bench-data"),
        ("auto", None, "dotted.bucket"),
    ):
        config = botocore.config.Config(signature_version="s3v4", s3={"addressing_style": style})
        s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="eu-west-1",
            aws_access_key_id="AKIDEXAMPLE",
            aws_secret_access_key="secret",
            config=config,
        )
        made.append((s3, bucket))
    return made


CLIENTS = _clients()


@settings(max_examples=15, deadline=None)
@given(keys=st.lists(st.text(KEY_CHARS, min_size=1, max_size=20), min_size=1, max_size=4))
def test_object_urls_from_the_buckets_template_are_botocores(keys: list[str]) -> None:
    """The direct transport presigns once per bucket (s3.client.target_template) and derives each object's
    URL: the same URL and region as presigning that object, for path and virtual-host addressing."""
    for s3, bucket in CLIENTS:
        template = client.target_template(s3, bucket)
        assert template is not None
        for key in [*keys, "a/b c+d=e&f?g#h%i", "/lead//x", "ü€/~"]:
            assert client.templated_target(template, key) == client.resolve_target(s3, bucket, key)
