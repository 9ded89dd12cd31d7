"""The only place that imports boto3/botocore: clients (one per process and config, kept by
:mod:`fastload.s3.runtime`), the
translation of botocore's exceptions into retry faults and fastload errors, and what the reader's direct
transport (``s3.transport``) shares with a client, through public botocore API only: the session that
resolves credentials (a refreshable set is refreshed before it expires) and the CA bundle both are built
with (:func:`get_session`, :func:`tls_verify`), the object URL and signing region (:func:`resolve_target`),
SigV4 headers (:class:`Signer`)."""

from __future__ import annotations

import datetime
import http.client
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import boto3
import botocore
import botocore.auth
import botocore.awsrequest
import botocore.config
import botocore.exceptions
import botocore.session
import urllib3.exceptions

from fastload.config import S3Config
from fastload.core import sigv4
from fastload.core.retry import Fault, classify_status
from fastload.errors import AccessDeniedError, ConfigError, S3Error, S3NotFoundError
from fastload.s3 import runtime


def parse_s3_url(url: str) -> tuple[str, str]:
    """``("bucket", "key/or/prefix")`` from ``s3://bucket/key``."""
    if not url.startswith("s3://"):
        raise ConfigError(f"{url!r} is not an s3:// URL")
    bucket, _, key = url[5:].partition("/")
    if not bucket:
        raise ConfigError(f"{url!r} has no bucket name; write s3://BUCKET/KEY")
    return bucket, key


def get_client(config: S3Config) -> Any:
    """This process's botocore S3 client for ``config``, created on first use (a forked child makes its
    own: clients are never shared across fork)."""
    return runtime.current().clients.get(config, lambda: new_client(config))


@dataclass(frozen=True)
class Sessions:
    """A botocore session (credentials, config variables) and the boto3 session wrapping it."""

    core: Any
    boto: Any


def get_session(config: S3Config) -> Sessions:
    """This process's sessions for ``config`` (its profile): clients and the direct transport share them,
    so they share one credentials object."""
    return runtime.current().sessions.get(config, lambda: _new_sessions(config))  # type: ignore[no-any-return]


def _new_sessions(config: S3Config) -> Sessions:
    core = botocore.session.Session(profile=config.profile or None)
    return Sessions(core, boto3.session.Session(botocore_session=core))


def credentials(config: S3Config) -> Any:
    """The credentials ``config``'s clients sign with (botocore's public ``get_credentials()``; None when
    none are configured)."""
    return get_session(config).boto.get_credentials()


def tls_verify(config: S3Config) -> str | None:
    """The CA bundle every connection for ``config`` verifies TLS with (``AWS_CA_BUNDLE`` or the profile's
    ``ca_bundle``), or None for the system's trust store; clients are built with it (``verify=``)."""
    value = get_session(config).core.get_config_variable("ca_bundle")
    return str(value) if value else None


def new_client(config: S3Config) -> Any:
    """A new botocore S3 client for ``config`` (use :func:`get_client`, which keeps one per process)."""
    return get_session(config).boto.client(
        "s3",
        endpoint_url=config.endpoint_url,
        region_name=config.region,
        verify=tls_verify(config),
        config=botocore.config.Config(
            s3={"addressing_style": config.addressing_style},
            # what botocore signs requests with anyway; said explicitly so that presigned URLs (used by
            # resolve_target to learn URL and region) are SigV4 too
            signature_version=botocore.UNSIGNED if config.unsigned else "s3v4",
            connect_timeout=config.connect_timeout_s,
            read_timeout=config.read_timeout_s,
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=max(config.process_max_concurrency, config.max_concurrency) + 4,
            tcp_keepalive=True,
            # fastload sends its own checksums (see s3/upload.py); botocore's automatic ones use aws-chunked
            # trailers that several S3-compatible stores reject.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )


@dataclass(frozen=True)
class Failure:
    """A failed request, classified: the fault, the HTTP status (if any) and printable words."""

    fault: Fault
    status: int | None
    message: str


class Unreachable(ConnectionError):
    """No connection to ``endpoint`` (``scheme://host:port``) at all: refused, no route, unknown host."""

    def __init__(self, endpoint: str, reason: str) -> None:
        super().__init__(f"cannot connect to {endpoint} ({reason})")
        self.endpoint, self.reason = endpoint, reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.endpoint, self.reason))


UNREACHABLE_ADVICE = (
    "nothing answers there: check the endpoint (AWS_ENDPOINT_URL or --endpoint-url, S3Config.endpoint_url; "
    "for gs:// STORAGE_EMULATOR_HOST, for az:// the connection string's BlobEndpoint) and that the server "
    "is running"
)


def _unreachable(exc: BaseException) -> Failure | None:
    """The UNREACHABLE failure for a connection that could not be made at all, naming the endpoint."""
    if isinstance(exc, Unreachable):
        endpoint, reason = exc.endpoint, exc.reason
    elif isinstance(exc, botocore.exceptions.EndpointConnectionError):
        parts = urlsplit(str(exc.kwargs.get("endpoint_url", "")))
        endpoint = f"{parts.scheme}://{parts.netloc}" if parts.netloc else "the S3 endpoint"
        reason = "refused or unreachable"
    elif isinstance(exc, ConnectionRefusedError):
        endpoint, reason = "the S3 endpoint", "connection refused"
    else:
        return None
    return Failure(Fault.UNREACHABLE, None, f"cannot connect to {endpoint} ({reason}); {UNREACHABLE_ADVICE}")


def endpoint_key(config: S3Config) -> str:
    """What the requests of ``config`` go to, as :class:`~fastload.s3.retrying.Retrier` remembers whether
    it ever answered: the endpoint URL, or the AWS default (by profile and region)."""
    return config.endpoint_url or f"aws:{config.profile or ''}:{config.region or ''}"


_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    http.client.HTTPException,  # a malformed or missing status line (IncompleteRead is tested first)
    ssl.SSLError,  # a TLS connection cut mid-stream (a failed certificate check is not retried)
    botocore.exceptions.ConnectionClosedError,
    botocore.exceptions.EndpointConnectionError,
    botocore.exceptions.ConnectionError,
    urllib3.exceptions.ProtocolError,
    ConnectionError,
)
_TIMEOUT_ERRORS: tuple[type[BaseException], ...] = (
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectTimeoutError,
    urllib3.exceptions.ReadTimeoutError,
    TimeoutError,
)
_SHORT_ERRORS: tuple[type[BaseException], ...] = (
    botocore.exceptions.IncompleteReadError,
    botocore.exceptions.ResponseStreamingError,
)


def _is_incomplete_read(exc: BaseException) -> bool:
    """urllib3 reports a body that ended early as a ProtocolError wrapping IncompleteRead."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, (urllib3.exceptions.IncompleteRead, http.client.IncompleteRead)):
            return True
        nested = [a for a in getattr(cur, "args", ()) if isinstance(a, BaseException)]
        cur = nested[0] if nested else (cur.__cause__ or cur.__context__)
    return False


def classify_exception(exc: BaseException) -> Failure | None:
    """The retry fault for an exception raised by botocore or while reading a body; None if not ours."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return None  # retrying cannot fix a certificate; the error says which one failed
    if isinstance(exc, botocore.exceptions.NoCredentialsError):  # not retried; the caller names the object
        return Failure(Fault.DENIED, None, NO_CREDENTIALS)
    if isinstance(exc, botocore.exceptions.ClientError):
        meta = exc.response.get("ResponseMetadata", {})
        status = int(meta.get("HTTPStatusCode", 0) or 0)
        code = str(exc.response.get("Error", {}).get("Code", "") or "")
        fault = classify_status(status, code or None)
        return Failure(fault, status, f"HTTP {status} {code}".strip())
    if isinstance(exc, _TIMEOUT_ERRORS):
        return Failure(Fault.TIMEOUT, None, f"timed out ({type(exc).__name__})")
    if isinstance(exc, _SHORT_ERRORS) or _is_incomplete_read(exc):
        return Failure(Fault.SHORT_BODY, None, f"response body ended early ({type(exc).__name__})")
    unreachable = _unreachable(exc)
    if unreachable is not None:
        return unreachable
    if isinstance(exc, _CONNECTION_ERRORS):
        return Failure(Fault.CONNECTION, None, f"connection failed ({type(exc).__name__})")
    return None


@dataclass(frozen=True)
class ObjectTarget:
    """Where plain HTTP requests for one object go, as botocore resolves it (endpoint, addressing style,
    region): ``url`` (scheme, host, path and any ``versionId`` query) and the SigV4 signing ``region``."""

    url: str
    region: str


def resolve_target(client: Any, bucket: str, key: str, version_id: str | None = None) -> ObjectTarget:
    """The URL and signing region botocore would use for ``GetObject`` on this object, read off a presigned
    URL (public API: every endpoint rule, addressing style and region setting applies). Raises
    :class:`AccessDeniedError` when no credentials are configured."""
    params = {"Bucket": bucket, "Key": key}
    if version_id:
        params["VersionId"] = version_id
    try:
        presigned = client.generate_presigned_url("get_object", Params=params, ExpiresIn=60)
    except botocore.exceptions.NoCredentialsError:
        raise no_credentials_error(bucket, key) from None
    parts = urlsplit(presigned)
    query = parse_qsl(parts.query, keep_blank_values=True)
    scope = dict(query).get("X-Amz-Credential", "").split("/")
    if client.meta.config.signature_version is botocore.UNSIGNED:  # no signature: no region to learn
        scope = ["", "", client.meta.region_name or "", "s3", ""]
    if len(scope) != 5 or scope[3] != "s3":
        raise ConfigError(
            f"s3://{bucket}/{key}: the S3 client does not sign with SigV4 (s3v4); use "
            "S3Config(transport='botocore') for this store"
        )
    kept = urlencode([(k, v) for k, v in query if not k.lower().startswith("x-amz-")])
    return ObjectTarget(urlunsplit((parts.scheme, parts.netloc, parts.path, kept, "")), scope[2])


PROBE_KEY = "fastload-probe"


def target_template(client: Any, bucket: str) -> tuple[str, str] | None:
    """``(URL prefix, signing region)`` such that an object ``key`` of ``bucket`` is at the prefix plus
    ``quote(key, safe="/~")`` (the encoding of botocore's serializer), learnt from one presigned URL (as
    :func:`resolve_target`); None when this client's URLs are not of that form (then resolve each key).
    Presigning costs about as much CPU as a small GET: a dataset's reads open many objects of one bucket."""
    probe = resolve_target(client, bucket, PROBE_KEY)
    if not probe.url.endswith("/" + PROBE_KEY):
        return None
    return probe.url[: -len(PROBE_KEY)], probe.region


def templated_target(template: tuple[str, str], key: str) -> ObjectTarget:
    """The target of ``key`` from its bucket's :func:`target_template`."""
    return ObjectTarget(template[0] + quote(key.encode("utf-8"), safe="/~"), template[1])


class Targets:
    """Object targets of one client: a bucket's :func:`target_template` learnt once, each key's target
    derived from it (a pinned version, or a client whose URLs are not of that form: presigned each)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._templates: dict[str, tuple[str, str] | None] = {}
        self._lock = threading.Lock()

    def target(self, bucket: str, key: str, version_id: str | None = None) -> ObjectTarget:
        if version_id:
            return resolve_target(self._client, bucket, key, version_id)
        with self._lock:
            known, template = bucket in self._templates, self._templates.get(bucket)
        if not known:  # (two threads may both learn it: the same answer)
            template = target_template(self._client, bucket)
            with self._lock:
                self._templates[bucket] = template
        if template is None:
            return resolve_target(self._client, bucket, key)
        return templated_target(template, key)


def is_no_credentials(exc: BaseException) -> bool:
    """Whether botocore raised ``exc`` because no credentials are configured."""
    return isinstance(exc, botocore.exceptions.NoCredentialsError)


NO_CREDENTIALS = (
    "no AWS credentials found; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE (a profile in "
    "~/.aws/config), or run where an instance role is available"
)


def no_credentials_error(bucket: str, key: str) -> AccessDeniedError:
    return AccessDeniedError(
        f"s3://{bucket}/{key}: {NO_CREDENTIALS}",
        bucket=bucket,
        key=key,
    )


class Signer:
    """SigV4 headers for one plain HTTP request, with the credentials the client signs with
    (:func:`credentials`; ``get_frozen_credentials()`` refreshes a refreshable set before it expires):
    :func:`fastload.core.sigv4.sign` (botocore's S3 signer gives the same headers, at several times the
    CPU a request; it still signs a request that carries a ``Date`` header)."""

    def __init__(self, creds: Any) -> None:
        self._creds = creds

    @property
    def has_credentials(self) -> bool:
        return self._creds is not None

    def headers(self, method: str, target: ObjectTarget, headers: Mapping[str, str]) -> dict[str, str]:
        """``headers`` plus ``X-Amz-Date``, ``X-Amz-Content-SHA256``, ``Authorization`` (and the session
        token, if any) for ``method`` on ``target``."""
        if self._creds is None:
            raise RuntimeError("no credentials")  # resolve_target raised the user's error before this
        frozen = self._creds.get_frozen_credentials()
        if not any(k.lower() == "date" for k in headers):
            return sigv4.sign(
                method,
                target.url,
                headers,
                access_key=frozen.access_key,
                secret_key=frozen.secret_key,
                token=frozen.token,
                region=target.region,
                now=datetime.datetime.now(datetime.timezone.utc),
            )
        request = botocore.awsrequest.AWSRequest(method=method, url=target.url, headers=dict(headers))
        botocore.auth.S3SigV4Auth(frozen, "s3", target.region).add_auth(request)
        return dict(request.headers.items())


def fail_fast_error(failure: Failure, bucket: str, key: str, what: str = "read") -> S3Error:
    """The error for a failure not worth retrying (404, 403, other 4xx), saying what to check."""
    url = f"s3://{bucket}/{key}"
    if failure.fault is Fault.NOT_FOUND:
        create = f"; to write to a new bucket, create it: fastload mb s3://{bucket}"
        return S3NotFoundError(
            f"{url}: not found ({failure.message}); check the bucket and key names, and that the endpoint "
            "and region point at the store that holds them"
            + (create if "NoSuchBucket" in failure.message else ""),
            bucket=bucket,
            key=key,
        )
    if failure.fault is Fault.DENIED and failure.message == NO_CREDENTIALS:
        return no_credentials_error(bucket, key)
    if failure.fault is Fault.DENIED:
        return AccessDeniedError(
            f"{url}: access denied ({failure.message}); check the credentials in use (AWS_PROFILE or the "
            f"AWS_ACCESS_KEY_ID variables), that they may {what} this bucket, and the region/endpoint",
            bucket=bucket,
            key=key,
        )
    return S3Error(
        f"{url}: the store rejected the request ({failure.message}); this will not succeed on retry",
        bucket=bucket,
        key=key,
    )
