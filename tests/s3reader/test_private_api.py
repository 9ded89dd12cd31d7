"""fastload reads no private botocore attribute, and no ``http.client`` internals.

Credentials come from the session's public ``get_credentials()``, the CA bundle from the session's public
``get_config_variable("ca_bundle")``, botocore bodies through ``StreamingBody.read``. The direct transport
speaks HTTP/1.1 itself (``fastload.s3.http1``); a connection's socket is read in one function,
``fastload.s3.transport.connection_socket``. A scan of every source and test file fails if anything else
reads ``sock``/``fp`` where ``http.client`` is imported, or a private botocore attribute."""

from __future__ import annotations

import ast
import datetime
import socket
import threading
from pathlib import Path

from botocore.credentials import RefreshableCredentials

from fastload.s3.client import ObjectTarget, Signer
from fastload.s3.http1 import Connection
from fastload.s3.transport import connection_socket

ROOT = Path(__file__).resolve().parents[2]
BOTOCORE_PRIVATE = {
    "_raw_stream",
    "_request_signer",
    "_credentials",
    "_endpoint",
    "http_session",
    "_verify",
    "_client_config",
    "_service_model",
    "_make_api_call",
    "_session",
    "_components",
}
HTTP_CLIENT_DETAILS = {"sock", "fp"}  # of HTTPConnection / HTTPResponse; not named by the documented API
OWNER = ("fastload/s3/transport.py", "connection_socket")


def _reads(path: Path, root: Path = ROOT) -> list[str]:
    """``attr`` reads (``x.attr`` with ``x`` not ``self``, or ``getattr(x, "attr")``) of the names above;
    ``http.client`` details only in files that import ``http.client``."""
    source = path.read_text()
    tree = ast.parse(source)
    names = set(BOTOCORE_PRIVATE)
    if "http.client" in source:
        names |= HTTP_CLIENT_DETAILS
    owner_lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and (str(path.relative_to(root)), node.name) == OWNER:
            owner_lines = set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    found = []
    for node in ast.walk(tree):
        attr = None
        if isinstance(node, ast.Attribute) and not (
            isinstance(node.value, ast.Name) and node.value.id == "self"
        ):
            attr = node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
        ):
            attr = node.args[1].value
        if attr in names and node.lineno not in owner_lines:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {attr}")
    return found


def test_nothing_reads_private_botocore_or_http_client_attributes() -> None:
    files = [p for d in ("fastload", "tests", "benchmarks") for p in (ROOT / d).rglob("*.py")]
    files = [p for p in files if p.name != Path(__file__).name]
    assert len(files) > 100
    found = [hit for path in files for hit in _reads(path)]
    assert not found, "private attributes read outside their one owner:\n" + "\n".join(found)


def test_the_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import http.client\n"
        "x = client._request_signer._credentials\n"
        "y = getattr(body, '_raw_stream', None)\n"
        "z = resp.fp\n"
        "self._credentials = 1\n"
    )
    hits = sorted(hit.split(": ")[1] for hit in _reads(bad, tmp_path))
    assert hits == ["_credentials", "_raw_stream", "_request_signer", "fp"]


def test_connection_socket_is_the_connections_socket() -> None:
    """The owner: a connected connection's socket (what an abort shuts down), None once closed."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    thread = threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True)
    thread.start()
    conn = Connection("http", "127.0.0.1", server.getsockname()[1], timeout=5, context=None)
    conn.connect()
    sock = connection_socket(conn)
    assert isinstance(sock, socket.socket) and sock.getpeername() == server.getsockname()
    conn.close()
    assert connection_socket(conn) is None
    thread.join(5)
    for s in (*accepted, server):
        s.close()


def test_refreshable_credentials_are_refreshed_before_they_expire() -> None:
    """The direct transport signs with the session's credentials object through its public
    ``get_frozen_credentials()``: a set about to expire is refreshed first, and the new keys sign."""
    issued: list[str] = []

    def refresh() -> dict[str, str]:
        issued.append(f"AKIDREFRESH{len(issued)}")
        expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=1)
        return {"access_key": issued[-1], "secret_key": "s", "token": "t", "expiry_time": expiry.isoformat()}

    creds = RefreshableCredentials.create_from_metadata(refresh(), refresh_using=refresh, method="test")
    headers = Signer(creds).headers("GET", ObjectTarget("http://127.0.0.1:9/b/k", "us-east-1"), {})
    assert len(issued) == 2  # within botocore's mandatory refresh window: refreshed before signing
    assert f"Credential={issued[-1]}/" in headers["Authorization"]
    assert headers["X-Amz-Security-Token"] == "t"
