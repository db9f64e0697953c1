"""The one path layer for every path a user gives: local paths and gs:// alike.

Everything goes through etils `epath` (what Orbax uses; with TensorFlow installed its
gs:// backend is `tf.io.gfile`), never through `open`, `os.path`, `shutil` or `pathlib`,
which do not understand gs:// (`os.makedirs("gs://b/x")` silently makes a local
`./gs:/b/x`). On GCS a directory rename is a copy then a delete, so "complete or absent"
outputs write a marker file last (`mark_complete` / `is_complete`) instead of renaming.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import zlib
from typing import Any, Iterator

from etils import epath

from common import errors

COMPLETE_MARKER = "COMPLETE"


def is_remote(path: str | os.PathLike) -> bool:
  return "://" in os.fspath(path)


def path(p: str | os.PathLike) -> epath.Path:
  """An absolute epath.Path: gs://... as given, local paths made absolute (Orbax wants
  absolute paths; `Path.absolute()` would turn gs://b into <cwd>/gs:/b)."""
  p = os.fspath(p)
  if is_remote(p):
    if p.startswith("gs://"):
      require_gcs_client(p)
    return epath.Path(p)
  return epath.Path(os.path.abspath(p))


def same_path(a: str | os.PathLike, b: str | os.PathLike) -> bool:
  """Whether two paths name the same file or directory: local ones after resolving links,
  `.`/`..` and a final /, remote ones as written less a final /."""
  a, b = os.fspath(a), os.fspath(b)
  if is_remote(a) or is_remote(b):
    return a.rstrip("/") == b.rstrip("/")
  return os.path.realpath(a) == os.path.realpath(b)


def join(base: str, *names: str) -> str:
  """`base/name/...` as a string (a relative base stays relative)."""
  return "/".join([os.fspath(base).rstrip("/")] + [n.strip("/") for n in names])


def glob(pattern: str) -> list[str]:
  """The paths matching `pattern` (`*`, `?`, `[...]` in any component; local or gs://),
  sorted, spelt from the pattern's own prefix (a relative pattern gives relative paths)."""
  parts = os.fspath(pattern).split("/")
  first = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")), None)
  if first is None:
    return [pattern] if path(pattern).exists() else []
  base = "/".join(parts[:first])
  root = path(base or ".")
  return sorted(join(base, os.fspath(p.relative_to(root))) if base else
                os.fspath(p.relative_to(root)) for p in root.glob("/".join(parts[first:])))


# ----------------------------------------------------------------------------
# Compressed files: read through the decompressor their suffix names.

COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}


def compression(p: str | os.PathLike) -> str | None:
  """"gzip", "zstd" or None, from the file name's last suffix."""
  name = os.fspath(p).lower()
  return next((kind for suffix, kind in COMPRESSIONS.items() if name.endswith(suffix)), None)


def _zstandard():
  try:
    import zstandard  # pylint: disable=g-import-not-at-top  (only .zst inputs need it)
  except ImportError as e:
    raise errors.MissingDependencyError(
        "Zstandard-compressed (.zst) files need the zstandard package: pip install -c "
        "constraints.txt -e . (or pip install zstandard).") from e
  return zstandard


def decompression_errors() -> tuple[type[BaseException], ...]:
  """What reading a damaged compressed stream raises (gzip: a bad header, a bad deflate
  block, a cut file; zstd: a bad frame)."""
  errs = (EOFError, zlib.error, gzip.BadGzipFile)
  try:
    import zstandard  # pylint: disable=g-import-not-at-top
    return errs + (zstandard.ZstdError,)
  except ImportError:
    return errs


@contextlib.contextmanager
def open_read(p: str | os.PathLike) -> Iterator[Any]:
  """A file's bytes as a binary stream with `read(n)`, decompressed as its suffix says
  (.gz: gzip, .zst / .zstd: Zstandard, several frames read as one stream); local or
  gs://. A damaged stream raises one of `decompression_errors()` while it is read."""
  kind = compression(p)
  with path(p).open("rb") as raw:
    if kind is None:
      yield raw
    elif kind == "gzip":
      with gzip.GzipFile(fileobj=raw, mode="rb") as f:
        yield f
    else:
      yield _ZstdReader(raw)


class _ZstdReader:
  """`read(n)` of a Zstandard stream of one or more frames that tells a cut file from a
  whole one: zstandard's stream_reader ends quietly where the compressed bytes end, so a file
  cut inside a frame read as a shorter complete one. Here the end of the bytes inside a frame
  raises ZstdError ("ends inside a Zstandard frame"), as does a damaged frame. A read may
  return fewer than n bytes (as a raw stream's); b"" is the end of a whole stream."""

  _CHUNK = 1 << 20  # compressed bytes a step

  def __init__(self, raw):
    self._raw, self._zstd = raw, _zstandard()
    self._frame = None  # the current frame's decompressor (None before the first)
    self._pending, self._read = memoryview(b""), 0  # decompressed, not yet returned

  def _fill(self) -> bool:
    """Decompresses the next compressed chunk into _pending; False at the end of a whole
    stream."""
    chunk = self._raw.read(self._CHUNK)
    if not chunk:
      if self._frame is not None and not self._frame.eof:
        raise self._zstd.ZstdError(
            f"the file ends inside a Zstandard frame after {self._read} compressed bytes "
            "(cut short: an interrupted download or copy?)")
      return False
    self._read += len(chunk)
    out = []
    while chunk:
      if self._frame is None or self._frame.eof:
        self._frame = self._zstd.ZstdDecompressor().decompressobj()
      out.append(self._frame.decompress(chunk))
      chunk = self._frame.unused_data if self._frame.eof else b""
    self._pending = memoryview(out[0] if len(out) == 1 else b"".join(out))
    return True

  def read(self, n: int = -1) -> bytes:
    if n < 0:
      parts = [bytes(self._pending)]
      while self._fill():
        parts.append(bytes(self._pending))
      self._pending = memoryview(b"")
      return b"".join(parts)
    while not self._pending:
      if not self._fill():
        return b""
    data, self._pending = bytes(self._pending[:n]), self._pending[n:]
    return data


def read_json(p: str | os.PathLike, default: Any = None) -> Any:
  """The JSON in `p`, or `default` when it does not exist."""
  p = path(p)
  if not p.exists():
    return default
  return json.loads(p.read_text())


def write_json(p: str | os.PathLike, obj: Any) -> None:
  """Writes `obj` as JSON, atomically (`write_text_atomic`)."""
  p = path(p)
  p.parent.mkdir(parents=True, exist_ok=True)
  write_text_atomic(p, json.dumps(obj, indent=2))


def write_text_atomic(p: str | os.PathLike, text: str) -> None:
  """Replaces the file `p` with `text` atomically (`write_bytes_atomic`)."""
  write_bytes_atomic(p, text.encode("utf-8"))


def write_bytes_atomic(p: str | os.PathLike, data: bytes) -> None:
  """Replaces the file `p` with `data` so that a reader (or a run after a kill or a full
  disk) finds the old content or the new, never a cut file. Locally: a temporary file
  beside it, renamed over it (a rename within a directory is atomic). On GCS an object
  upload is already all or nothing, so the object is written directly."""
  p = path(p)
  if is_remote(p):
    p.write_bytes(data)
    return
  tmp = p.parent / f".{p.name}.tmp-{os.getpid()}"
  try:
    tmp.write_bytes(data)
    tmp.replace(p)
  finally:
    if tmp.exists():
      tmp.unlink()


def check_output_dir(p: str | os.PathLike) -> None:
  """Refuses (errors.PathError) an output directory that a file stands in the way of: the
  path itself or one of its parents (local paths: on gs:// any name can hold objects)."""
  if is_remote(p):
    return
  for d in (path(p), *path(p).parents):
    if d.is_dir():
      return
    if d.exists():
      raise errors.PathError(f"The output directory {os.fspath(p)} cannot be created: {d} is a "
                             "file. Give another path for the output (a directory, created "
                             "if missing).")


def mark_complete(directory: str | os.PathLike) -> None:
  """Written last into a directory whose other files are complete."""
  (path(directory) / COMPLETE_MARKER).write_text("")


def is_complete(directory: str | os.PathLike) -> bool:
  return (path(directory) / COMPLETE_MARKER).exists()


def require_gcs_client(p: str) -> None:
  """gs:// checkpoints need google-cloud-storage (Orbax asks it about every gs:// dir)."""
  try:
    import google.cloud.storage  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise errors.MissingDependencyError(
        f"{p} is on Google Cloud Storage, which needs the google-cloud-storage package: "
        "pip install -c constraints.txt -e . (or pip install google-cloud-storage).") from e


# ----------------------------------------------------------------------------
# Checksums: a manifest of a finished directory, verified before it is trusted.

MANIFEST = "MANIFEST.json"
_CHUNK = 8 << 20


def _crc32(p: epath.Path) -> tuple[int, int]:
  """(size, CRC-32) of a file, streamed."""
  crc, size = 0, 0
  with p.open("rb") as f:
    while chunk := f.read(_CHUNK):
      crc, size = zlib.crc32(chunk, crc), size + len(chunk)
  return size, crc


def _files(directory: epath.Path) -> list[epath.Path]:
  """Every file under `directory` but the manifest (listing directory by directory)."""
  out = []
  for p in directory.iterdir():
    if p.is_dir():
      out.extend(_files(p))
    elif not p.name.startswith(MANIFEST):  # the manifest and a cut-short write of it
      out.append(p)
  return sorted(out, key=os.fspath)


def write_manifest(directory: str | os.PathLike) -> None:
  """`directory/MANIFEST.json`: the size and CRC-32 of every file under it (written last,
  once the directory is complete; reading the files back costs one pass over them).

  Written whole or not at all: to MANIFEST.json.tmp, then renamed (atomic on a local disk;
  on GCS the renamed object appears only once complete, as every object does), so a
  process killed while writing leaves the step unverified, never with a partial manifest
  that would read as damage."""
  directory = path(directory)
  files = {}
  for p in _files(directory):
    size, crc = _crc32(p)
    files[os.fspath(p.relative_to(directory))] = {"size": size, "crc32": crc}
  tmp = directory / (MANIFEST + ".tmp")
  tmp.write_text(json.dumps({"files": files}, indent=1))
  tmp.rename(directory / MANIFEST)


def verify_manifest(directory: str | os.PathLike) -> list[str] | None:
  """None when `directory` has no manifest (unverified); else the problems found (missing
  files, sizes or checksums that differ from the manifest): [] means intact."""
  directory = path(directory)
  if not (directory / MANIFEST).exists():
    return None
  try:
    files = json.loads((directory / MANIFEST).read_text())["files"]
  except (ValueError, KeyError, TypeError):
    return [f"{directory / MANIFEST} is not a valid manifest"]
  problems = []
  for name, want in sorted(files.items()):
    p = directory / name
    if not p.exists():
      problems.append(f"{name}: missing")
      continue
    size, crc = _crc32(p)
    if size != want["size"]:
      problems.append(f"{name}: {size} bytes, {want['size']} when saved (truncated or overwritten)")
    elif crc != want["crc32"]:
      problems.append(f"{name}: checksum differs from when it was saved (corrupted bytes)")
  return problems
