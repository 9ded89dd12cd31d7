"""moto's S3 fake as an HTTP server on a free 127.0.0.1 port, in a thread of this process.

Good for correctness tests on small objects only: moto copies the whole object for every ranged GET, so it is
never the origin of a benchmark (use ``rgw.RadosGateway``). Same attributes as ``RadosGateway``.

    with MotoS3Server() as server:
        server.client().list_buckets()
"""

from __future__ import annotations

import logging
from typing import Any


class MotoS3Server:
    """``moto.server.ThreadedMotoServer`` on 127.0.0.1 with a fixed key pair; a context manager."""

    region = "us-east-1"

    def __init__(
        self, *, access_key: str = "fastload-moto-access", secret_key: str = "fastload-moto-secret"
    ) -> None:
        self.access_key = access_key
        self.secret_key = secret_key
        self.port: int | None = None
        self._server: Any = None

    @property
    def endpoint_url(self) -> str:
        if self.port is None:
            raise RuntimeError("MotoS3Server is not started; call start() first")
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MotoS3Server:
        from moto.server import ThreadedMotoServer

        if self._server is not None:
            raise RuntimeError("MotoS3Server is already started")
        werkzeug_log = logging.getLogger("werkzeug")
        if werkzeug_log.level == logging.NOTSET:
            werkzeug_log.setLevel(logging.WARNING)  # one line per request on stderr otherwise
        # Port 0: the kernel picks a free port at bind time, so there is no race with other processes.
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        self._server = server
        self.port = server.get_host_and_port()[1]
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            # ThreadedMotoServer.stop() shuts the loop down but leaves the listening socket open.
            if self._server._server is not None:
                self._server._server.server_close()
            self._server = None
        self.port = None

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client for this server, path-style addressing; ``config`` overrides botocore Config."""
        import boto3
        from botocore.config import Config

        settings: dict[str, Any] = {"s3": {"addressing_style": "path"}, "retries": {"max_attempts": 2}}
        settings.update(config)
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(**settings),
        )

    def info(self) -> dict[str, str]:
        return {
            "endpoint_url": self.endpoint_url,
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "region": self.region,
        }

    def __enter__(self) -> MotoS3Server:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
