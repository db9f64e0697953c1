"""Google's original TF BERT checkpoints (bert_model.ckpt.* beside a bert_config.json): their
variables as BERT's canonical flat dict (HuggingFace's names without the `bert.` prefix, in
PyTorch layout), which bert_formats.py maps onto our parameter tree. TensorFlow is
imported only to read one (input_pipeline.records.tensorflow: without it, one line saying so);
a damaged file is one line naming it (CorruptTFCheckpointError).
"""
from __future__ import annotations

import re

import numpy as np

from common import errors
from common import fileio
from input_pipeline import records

# Variables of a TF checkpoint that carry no weights: optimizer slots and counters.
_TF_IGNORED = re.compile(r"(/adam_[mv]$|^global_step$|/Momentum$|^bad_steps$|^loss_scale$|^good_steps$)")
# The classifier head Google's run_classifier.py saves at the top (canonical names): another
# task's head, left out when a read does not use it (formats.check_read).
HEADS = ("output_weights", "output_bias")


def tf_name_to_canonical(name: str) -> tuple[str, bool]:
  """Google variable name -> (canonical name, needs transpose)."""
  name = name.removeprefix("bert/")
  transpose = name.endswith("/kernel")
  name = re.sub(r"layer_(\d+)", r"layer.\1", name)
  name = re.sub(r"/(kernel|gamma|output_weights)$", "/weight", name)
  name = re.sub(r"/(beta|output_bias)$", "/bias", name)
  if name.endswith("_embeddings"):
    name += "/weight"
  return name.replace("/", "."), transpose


class CorruptTFCheckpointError(errors.UserError, ValueError):
  """A file of a Google TF checkpoint that TensorFlow cannot read (truncated or corrupt), as
  formats.CorruptCheckpointFileError is for other formats (this module lies below it)."""


def _tensorflow(path: str):
  return records.tensorflow(f"the Google TF checkpoint {path}")


def _read_errors(tf) -> tuple[type[BaseException], ...]:
  """What TensorFlow's checkpoint reader raises on a damaged file (its C++ errors reach
  Python as OpError, RuntimeError or, for a short read, IndexError)."""
  return (tf.errors.OpError, RuntimeError, IndexError)


def _damaged(what: str, e: BaseException) -> CorruptTFCheckpointError:
  detail = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
  return CorruptTFCheckpointError(
      f"{what} is truncated or corrupt ({detail}): download or copy the checkpoint again.")


def read_tf_state(ckpt_path: str, origin: dict[str, str] | None = None) -> dict[str, np.ndarray]:
  """The canonical flat dict of the TF checkpoint `ckpt_path` (its prefix, without .index);
  `origin` (when given) gets each canonical name's variable name."""
  tf = _tensorflow(ckpt_path)  # only Google TF checkpoints
  try:
    reader = tf.train.load_checkpoint(ckpt_path)
    names = reader.get_variable_to_shape_map()
  except _read_errors(tf) as e:
    raise _damaged(f"{ckpt_path}.index (the Google TF checkpoint {ckpt_path})", e) from None
  state = {}
  for name in names:
    if _TF_IGNORED.search(name):
      continue  # Optimizer slots and counters.
    canonical, transpose = tf_name_to_canonical(name)
    try:
      value = reader.get_tensor(name)
    except _read_errors(tf) as e:
      raise _damaged(f"{ckpt_path}.data-* (the Google TF checkpoint {ckpt_path}, variable "
                     f"{name})", e) from None
    state[canonical] = np.ascontiguousarray(value.T) if transpose else value
    if origin is not None:
      origin[canonical] = name
  return state


def find_checkpoint(path: str) -> str | None:
  """The TF checkpoint at `path` (a prefix, or a directory: the latest its `checkpoint` file
  names, else the first .index file in it), or None."""
  if fileio.path(path + ".index").exists():
    return path
  if fileio.path(path).is_dir():
    if (fileio.path(path) / "checkpoint").exists():  # (TensorFlow reads it: only then needed)
      tf = _tensorflow(path)
      try:
        latest = tf.train.latest_checkpoint(path)
      except _read_errors(tf) as e:
        raise _damaged(f"{fileio.join(path, 'checkpoint')}", e) from None
      if latest:
        return latest
    for f in sorted(fileio.path(path).iterdir(), key=str):
      if f.name.endswith(".index"):
        return fileio.join(path, f.name[:-len(".index")])
  return None
