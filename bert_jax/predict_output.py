"""What `python -m bert_jax.predict` writes for --mode=features and --mode=embed: the rows
streamed into a .npy file (its header written first) or JSON Lines; for the other modes,
what they print, into --output when it is given; the --output path checked before any work
(its directory, a suffix the mode writes)."""
from __future__ import annotations

import contextlib
import io
import json
import os
from typing import Sequence

import numpy as np

from bert_jax.predict_checks import PredictError
from common import fileio

# The files --mode=features and --mode=embed write, by --output's suffix.
SUFFIXES = (".npy", ".jsonl")


# What the other modes print (fill_mask, tag: text; classify, qa: a JSON object a line),
# written into --output instead when it is given: its suffix.
PRINTED_SUFFIXES = {"fill_mask": ".txt", "tag": ".txt", "classify": ".jsonl", "qa": ".jsonl"}


def check_output(path: str, mode: str) -> None:
  """Before any work: `path`'s suffix is one `mode` writes, and its directory exists."""
  suffix = os.path.splitext(path)[1]
  printed = PRINTED_SUFFIXES.get(mode)
  if printed and suffix != printed:
    raise PredictError(f"--output={path}: --mode={mode} writes what it prints, as {printed}: "
                       f"name it e.g. {path.removesuffix(suffix)}{printed}.")
  if not printed and suffix not in SUFFIXES:
    raise PredictError(
        f"--output={path}: --mode={mode} writes {' or '.join(SUFFIXES)}, not "
        f"{suffix or 'no suffix'}: name it e.g. {path.removesuffix(suffix)}.npy (NumPy"
        + ("; FILE_mask.npy beside it" if mode == "features" else "") + ") or "
        f"{path.removesuffix(suffix)}.jsonl (one JSON object a line).")
  parent = fileio.path(path).parent
  if not fileio.is_remote(path) and not parent.is_dir():  # GCS has no directories to create
    raise PredictError(f"--output={path}: the directory {parent} does not exist: create it or "
                       "write elsewhere.")


class _Printed(io.TextIOBase):
  """Text printed, written to `path` as UTF-8, the file created at the first write (so that a
  run refused before it prints leaves none); `lines` counts the lines."""

  def __init__(self, path: str):
    super().__init__()
    self.path, self.file, self.lines = path, None, 0

  def writable(self) -> bool:
    return True

  def write(self, text: str) -> int:
    if self.file is None:
      self.file = fileio.path(self.path).open("wb")
    self.file.write(text.encode("utf-8"))
    self.lines += text.count("\n")
    return len(text)

  def close(self) -> None:
    if self.file is not None:
      self.file.close()
    super().close()


@contextlib.contextmanager
def printed_to(path: str | None):
  """Inside, what is printed goes into `path` (None: stdout, as it is); after, one JSON line
  on stdout says where and how many lines ({"output", "lines"})."""
  if not path:
    yield
    return
  sink = _Printed(path)
  try:
    with contextlib.redirect_stdout(sink):
      yield
    sink.write("")  # an empty output is still a file
  finally:
    sink.close()
  print(json.dumps({"output": path, "lines": sink.lines}))


def write_features_jsonl(f, batches, tokenizer, layers: Sequence[int], pooled: bool) -> int:
  """Google's extract_features.py output: one JSON object per line of input, {"linex_index",
  "features": [{"token", "layers": [{"index", "values"}]}]} over the real tokens (or, pooled,
  {"linex_index", "pooled": [...]}), a row whose mask is all zero (a blank line) with
  "blank": true; returns the number of lines written."""
  n = 0
  for ids, feats, mask in batches:
    for row_ids, row, row_mask in zip(ids, feats, mask):
      if pooled:
        record = {"linex_index": n, "pooled": [round(float(v), 6) for v in row]}
      else:
        length = int(row_mask.sum())
        record = {"linex_index": n, "features": [
            {"token": token, "layers": [{"index": layer, "values": [round(float(v), 6) for v in vec]}
                                        for layer, vec in zip(layers, row[t])]}
            for t, token in enumerate(tokenizer.convert_ids_to_tokens(row_ids[:length]))]}
      if not row_mask.any():  # a blank line (predict._blank_rows): no tokens
        record["blank"] = True
      f.write((json.dumps(record) + "\n").encode("utf-8"))
      n += 1
  return n


def write_embeddings_jsonl(f, batches) -> int:
  """{"line_index", "embedding"} a line (a blank line's with "blank": true); returns the
  number of lines written."""
  n = 0
  for _, batch, real in batches:
    for v, r in zip(batch, real):
      row = {"line_index": n, "embedding": [float(x) for x in v], **({} if r else {"blank": True})}
      f.write((json.dumps(row) + "\n").encode("utf-8"))
      n += 1
  return n


def write_features_npy(out: str, batches, num_texts: int, masks: bool = True) -> tuple[int, ...]:
  """Streams the batches into OUT.npy (features) and, with `masks`, OUT_mask.npy, their
  headers written first for `num_texts` rows (memory flat in the number of texts); returns
  the shape."""
  shape = None
  with contextlib.ExitStack() as files:
    f = files.enter_context(fileio.path(out).open("wb"))
    fm = files.enter_context(fileio.path(out.removesuffix(".npy") + "_mask.npy").open("wb")
                             ) if masks else None
    written = 0
    for _, feats, mask in batches:
      if shape is None:
        shape = (num_texts,) + feats.shape[1:]
        f.write(_npy_header(feats.dtype, shape))
        if fm:
          fm.write(_npy_header(mask.dtype, (num_texts,) + mask.shape[1:]))
      f.write(np.ascontiguousarray(feats).tobytes())
      if fm:
        fm.write(np.ascontiguousarray(mask).tobytes())
      written += len(feats)
  if written != num_texts:
    raise PredictError(f"--input_file changed while it was read ({num_texts} lines counted, "
                       f"{written} read): {out} is incomplete; run again.")
  return shape


def _npy_header(dtype, shape: tuple[int, ...]) -> bytes:
  """The .npy format's header of an array of `dtype` and `shape` (C order)."""
  buf = io.BytesIO()
  np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                             "fortran_order": False, "shape": tuple(shape)})
  return buf.getvalue()
