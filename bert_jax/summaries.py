"""TensorBoard scalar summaries written without TensorFlow.

`EventWriter(logdir)` writes TensorBoard's event files (TFRecord framing of `Event` protocol
buffers, the format `tf.summary` writes) straight from Python: no TensorFlow or clu import on
a job's path (3-4 s and ~800 MB of every process otherwise, and absent from most GPU images).
Scalars only, which is what the jobs log. Paths go through the path layer, so a gs:// workdir
works: a local file is appended to as values come; a remote one (GCS objects cannot be
appended to) is rewritten whole at most every `remote_flush_s` seconds and at `flush()` /
`close()`, and a new file is started past 4 MiB so a rewrite stays small.
"""
from __future__ import annotations

import os
import socket
import struct
import threading
import time
from typing import Mapping

import numpy as np

from common import fileio

_REMOTE_FILE_BYTES = 4 << 20


def _crc32c_table() -> list[int]:
  table = []
  for i in range(256):
    crc = i
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    table.append(crc)
  return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
  """CRC-32C (Castagnoli), the checksum of TFRecord framing."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
  """One TFRecord: length, its masked CRC, the data, its masked CRC."""
  length = struct.pack("<Q", len(data))
  return (length + struct.pack("<I", _masked_crc(length)) + data
          + struct.pack("<I", _masked_crc(data)))


def _varint(value: int) -> bytes:
  out = bytearray()
  while True:
    bits, value = value & 0x7F, value >> 7
    out.append(bits | (0x80 if value else 0))
    if not value:
      return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:
  return _varint(number << 3 | 2) + _varint(len(payload)) + payload


# A scalar's Summary.Value as TF2's tf.summary.scalar writes it (what clu wrote before, and
# what TensorBoard's tensor readers expect): metadata (9) = SummaryMetadata{plugin_data (1) =
# PluginData{plugin_name (1) = "scalars"}, data_class (4) = DATA_CLASS_SCALAR (1)}; tensor (8)
# = TensorProto{dtype (1) = DT_FLOAT (1), tensor_shape (2) = {} (a scalar), float_val (5)}.
_SCALAR_METADATA = _field_bytes(9, _field_bytes(1, _field_bytes(1, b"scalars")) + b"\x20\x01")


def _scalar_value(tag: str, value: float) -> bytes:
  tensor = b"\x08\x01" + _field_bytes(2, b"") + _field_bytes(5, struct.pack("<f", value))
  return _field_bytes(1, tag.encode()) + _SCALAR_METADATA + _field_bytes(8, tensor)


def event(wall_time: float, *, step: int | None = None, file_version: str | None = None,
          scalars: Mapping[str, float] | None = None) -> bytes:
  """An `Event` proto: wall_time (1, double), step (2, int64), file_version (3, string),
  summary (5, Summary{value (1): a scalar's Value each, see `_scalar_value`})."""
  out = bytearray(b"\x09" + struct.pack("<d", wall_time))
  if step is not None:
    out += b"\x10" + _varint(int(step) & (2**64 - 1))
  if file_version is not None:
    out += _field_bytes(3, file_version.encode())
  if scalars:
    values = b"".join(_field_bytes(1, _scalar_value(tag, float(v))) for tag, v in scalars.items())
    out += _field_bytes(5, values)
  return bytes(out)


class EventWriter:
  """`write_scalars(step, {tag: value})`, `flush()`, `close()` into TensorBoard event files."""

  def __init__(self, logdir: str, remote_flush_s: float = 30.0):
    self.logdir, self.remote = logdir, fileio.is_remote(logdir)
    self.remote_flush_s = remote_flush_s
    self._lock = threading.Lock()
    self._file, self._pending, self._written, self._last_flush = None, bytearray(), bytearray(), 0.0
    self._files = 0

  def _new_file(self) -> None:
    self._files += 1  # TensorBoard reads a directory's files in name order
    name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
            f".{id(self) & 0xFFFF}.{self._files:04d}.bert_jax")
    fileio.path(self.logdir).mkdir(parents=True, exist_ok=True)
    self._file = fileio.path(fileio.join(self.logdir, name))
    self._written = bytearray()
    self._pending = bytearray(record(event(time.time(), file_version="brain.Event:2")))

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    values = {k: float(np.asarray(v)) for k, v in scalars.items()}
    with self._lock:
      if self._file is None or (self.remote and len(self._written) + len(self._pending)
                                                      > _REMOTE_FILE_BYTES):
        self._flush_locked()
        self._new_file()
      self._pending += record(event(time.time(), step=step, scalars=values))
      if not self.remote or time.time() - self._last_flush >= self.remote_flush_s:
        self._flush_locked()

  def _flush_locked(self) -> None:
    if self._file is None or not self._pending:
      return
    if self.remote:  # GCS objects are written whole
      self._written += self._pending
      self._file.write_bytes(bytes(self._written))
    else:
      with self._file.open("ab") as f:
        f.write(bytes(self._pending))
    self._pending = bytearray()
    self._last_flush = time.time()

  def flush(self) -> None:
    with self._lock:
      self._flush_locked()

  def close(self) -> None:
    self.flush()


class NullWriter:
  """What processes other than 0 write: nothing."""

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    del step, scalars

  def flush(self) -> None:
    pass

  def close(self) -> None:
    pass
