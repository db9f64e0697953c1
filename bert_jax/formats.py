"""What every family's checkpoint format shares, on the host: reading HuggingFace weights
(safetensors, sharded too, or a weights-only pytorch_model.bin) and config.json, the errors
that name a bad file, paths into parameter trees, the task heads transformers' classes name
alike, and bert_jax exports (the unrolled tree as safetensors beside its model config).

Each family's own names and config.json live beside its model under bert_jax/models/ (BERT's
in bert_formats.py); bert_jax/loader.py, the one way weights enter a model, picks the family
of a checkpoint, converts layouts, checks fit and finiteness, and reads our own runs.
`python -m bert_jax.convert` writes exports.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import re
from typing import Any, Iterable, Mapping

from absl import logging
from etils import epath
import flax.linen as nn
import jax
import numpy as np
import safetensors
import safetensors.numpy

from bert_jax import families
from common import errors
from common import fileio

Array = np.ndarray
Params = dict[str, Any]

NATIVE_CONFIG = "bert_jax_config.json"
NATIVE_PARAMS = "params.safetensors"


class CheckpointMismatchError(errors.UserError, ValueError):
  """A checkpoint's tensors do not match the model (or its config.json): names them all."""


class CheckpointNotFoundError(errors.UserError, FileNotFoundError):
  """The path given as a checkpoint does not exist or holds no checkpoint bert_jax reads."""


class CorruptCheckpointFileError(errors.UserError, ValueError):
  """A checkpoint file that cannot be read (truncated or corrupt): names the file."""


def heads(params: Params) -> dict[str, bool]:
  """Which optional parts a parameter tree holds: {"pooler", "mlm", "nsp"} -> bool."""
  encoder = params.get("bert", params)
  return {"pooler": "pooler" in encoder or "head" in encoder,  # the modern encoders' head
          "mlm": bool({"transform", "decoder_bias", "lm_head"} & set(params)),
          "nsp": "seq_relationship" in params}


def describe_heads(h: Mapping[str, bool]) -> str:
  """"encoder + masked-LM head + pooler", ... for messages."""
  labels = (("mlm", "masked-LM head"), ("nsp", "NSP head"), ("pooler", "pooler"))
  return " + ".join(["encoder"] + [label for name, label in labels if h.get(name)])


def set_path(tree: dict, path: tuple[str, ...], value) -> None:
  """tree[path[0]][path[1]]... = value, creating the dicts on the way."""
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def get_path(tree: Mapping, path: tuple[str, ...]):
  """tree[path[0]][path[1]]..."""
  for key in path:
    tree = tree[key]
  return tree


def to_numpy(tree):
  """A parameter tree (boxed or not, on devices or not) as numpy arrays on the host."""
  return jax.tree_util.tree_map(lambda x: np.asarray(jax.device_get(x)), nn.unbox(tree))


# ----------------------------------------------------------------------------
# config.json.

HF_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "intermediate_size")


def read_config_json(p: epath.Path) -> dict[str, Any]:
  """A checkpoint's config.json / bert_config.json: a JSON object holding BERT's sizes;
  anything else is a CorruptCheckpointFileError naming the file and what is wrong."""
  try:
    hf = json.loads(p.read_text())
  except (ValueError, UnicodeDecodeError) as e:
    raise CorruptCheckpointFileError(
        f"{p} is not JSON ({str(e).splitlines()[0][:200]}): copy or download the checkpoint "
        "again, or fix the file.") from None
  if not isinstance(hf, dict):
    raise CorruptCheckpointFileError(f"{p} holds a JSON {type(hf).__name__}, not the object "
                                     "of a model config: fix the file.")
  missing = [k for k in HF_REQUIRED if not isinstance(hf.get(k), int)]
  if missing:
    raise CorruptCheckpointFileError(
        f"{p} lacks {', '.join(repr(k) for k in missing)} (or not as an integer): a BERT "
        f"config gives {', '.join(HF_REQUIRED)}; fix the file (the values must match the "
        "weights).")
  return hf


# ----------------------------------------------------------------------------
# Readers.

def _read_safetensors(p: epath.Path) -> dict[str, Array]:
  try:
    if fileio.is_remote(p):
      return safetensors.numpy.load(p.read_bytes())
    return safetensors.numpy.load_file(os.fspath(p))  # memory-mapped
  except safetensors.SafetensorError as e:
    raise _corrupt(p, e) from None


def _corrupt(p, e: Exception) -> CorruptCheckpointFileError:
  return CorruptCheckpointFileError(
      f"{p} is truncated or corrupt ({type(e).__name__}: {e}): copy, download or convert the "
      "checkpoint again.")


def write_safetensors(p: epath.Path, tensors: dict[str, Array], metadata=None) -> None:
  p.write_bytes(safetensors.numpy.save(tensors, metadata=metadata))


def read_hf_state(path: str, origin: dict[str, str] | None = None) -> dict[str, Array]:
  """model.safetensors (sharded too) or pytorch_model.bin, `bert.` prefix stripped
  (canonical_names; `origin` gets each name's in the file)."""
  d = fileio.path(path)
  files = sorted((f for f in d.iterdir() if f.name.endswith(".safetensors")), key=str)
  state: dict[str, Array] = {}
  if files:
    for f in files:
      state.update(_read_safetensors(f))
  elif (d / "pytorch_model.bin").exists():
    import torch  # pylint: disable=g-import-not-at-top  (optional: only .bin files need torch; weights_only, never arbitrary objects)
    try:
      raw = torch.load(io.BytesIO((d / "pytorch_model.bin").read_bytes()), map_location="cpu",
                       weights_only=True)
    except pickle.UnpicklingError:  # weights_only refused an object that is not a tensor
      raise CorruptCheckpointFileError(
          f"{d / 'pytorch_model.bin'} holds Python objects other than tensors, which could run "
          "code when loaded: it is refused and was not unpickled. Use the checkpoint's "
          "model.safetensors, or convert it to safetensors where its source is trusted.") from None
    except (RuntimeError, EOFError, ValueError) as e:  # torch's "PytorchStreamReader failed ..."
      raise _corrupt(d / "pytorch_model.bin", e) from None
    if not isinstance(raw, dict):
      raise CorruptCheckpointFileError(f"{d / 'pytorch_model.bin'} holds a {type(raw).__name__}, "
                                       "not a state dict of tensors.")
    state = {k: v.float().numpy() for k, v in raw.items()}
  else:
    others = [f.name for f in d.iterdir() if f.name in ("flax_model.msgpack", "tf_model.h5")]
    raise CheckpointNotFoundError(
        f"No model.safetensors or pytorch_model.bin in {path}"
        + (f" (it holds {', '.join(others)}: bert_jax reads the PyTorch weights, which the "
           "model's Hub page also offers; or convert them with transformers)" if others else "")
        + ".")
  return canonical_names(state, origin)


def canonical_names(state: Mapping[str, Array], origin: dict[str, str] | None = None
                    ) -> dict[str, Array]:
  """`state` without the `bert.` prefix, LayerNorm's gamma/beta as weight/bias; `origin`
  (when given) maps each new name to the file's (see `file_names`)."""
  out, given = {}, dict(origin or {})
  for name, value in state.items():
    new = name.removeprefix("bert.")
    if "LayerNorm" in new:  # Old checkpoints name LayerNorm params gamma/beta.
      new = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", new))
    out[new] = np.asarray(value)
    if origin is not None:
      origin[new] = given.get(name, name)
  return out


def renamed(state: Mapping[str, Array], pairs: tuple[tuple[str, str], ...], strip: str = "",
            add: str = "", origin: dict[str, str] | None = None) -> dict[str, Array]:
  """`state` with each name that starts with a pair's first string starting with its second
  instead, and every other name without the prefix `strip` and with the prefix `add` (a
  family's HuggingFace names <-> BERT's canonical ones); `origin` as canonical_names'."""
  out, given = {}, dict(origin or {})
  for name, value in state.items():
    old = next((a for a, _ in pairs if name.startswith(a)), None)
    new = (add + name.removeprefix(strip) if old is None
           else dict(pairs)[old] + name[len(old):])
    out[new] = value
    if origin is not None:
      origin[new] = given.get(name, name)
  return out


def file_names(names: Iterable[str], origin: Mapping[str, str] | None) -> list[str]:
  """Tensor names as the checkpoint's file spells them (a reader's `origin`: its names ->
  the file's; a name it does not hold is its own), for messages."""
  return [(origin or {}).get(k, k) for k in names]


def describe_model(cfg: Any, target: str) -> str:
  """"the roberta encoder", "the bert pre-training model", ... for messages."""
  kind = {"encoder": "encoder", "pretraining": "pre-training model"}.get(target, "model")
  return f"the {cfg.family} {kind}"


def untie_decoder(state: dict[str, Array], source: str,
                  origin: Mapping[str, str] | None = None) -> dict[str, Array]:
  """`state` (canonical, BERT's masked-LM head layout) without the MLM decoder's copies of
  the word embeddings and the output bias (tied: accepted only when they really are the same
  tensors), in place."""
  for dup, orig in (("cls.predictions.decoder.weight", "embeddings.word_embeddings.weight"),
                    ("cls.predictions.decoder.bias", "cls.predictions.bias")):
    if dup in state:
      if orig in state and state[orig].shape == state[dup].shape and np.array_equal(state[orig], state[dup]):
        del state[dup]
      elif orig not in state and dup.endswith("bias"):
        state[orig] = state.pop(dup)
      else:
        dup, orig = file_names((dup, orig), origin)
        raise CheckpointMismatchError(
            f"{source}: {dup} differs from {orig}; bert_jax ties the MLM output "
            "projection to the word embeddings and cannot load an untied one.")
  return state


# Buffers transformers saves beside the weights in some uploads and ignores when it reads
# them (position ids, token types, old rotary models' frequencies): no weights of ours.
IGNORED_BUFFERS = re.compile(r"(^|\.)(position_ids|token_type_ids|rotary_emb\.inv_freq)$")
# transformers' task heads every family may hold outside its encoder: a tensor under one
# that a read does not use is another task's head, left out (named); any other unused
# tensor is refused (check_read).
HEADS = ("cls.", "classifier.", "qa_outputs.")
_LAYER = re.compile(r"(?:^|[./])layers?[._](\d+)[./]")  # HuggingFace's, TF's and ours


def check_read(source: str, model: str, *, missing=(), bad_shape=(), unused=(),
               heads: tuple[str, ...] = HEADS, origin: Mapping[str, str] | None = None,
               num_layers: int | None = None, config_file: str = "config.json") -> list[str]:
  """The one check every family's reader makes of a checkpoint's tensors, against the model
  its config file describes (`model`: describe_model's words). Refused in one line naming
  the tensors as the file does (the first few and the count) and what to do: `missing`
  ones, `bad_shape` ones ("name: shape"), and every `unused` one but the buffers
  transformers ignores too (IGNORED_BUFFERS) and those under `heads` (another task's head):
  a layer more than the config says, a tensor no such model has. Returns those heads, for
  warn_left_out once the read succeeds."""
  unused = [k for k in unused if not IGNORED_BUFFERS.search(k)]
  left_out = [k for k in unused if k.startswith(heads)]
  others = [k for k in unused if not k.startswith(heads)]
  foreign = sorted(file_names(others, origin))
  if not (missing or bad_shape or foreign):
    return left_out
  problems = [_few(label, list(names)) for label, names in (
      ("missing tensors", missing), ("tensors of the wrong shape", bad_shape),
      ("unused tensors", foreign)) if names]
  more = sorted({int(m.group(1)) for m in map(_LAYER.search, others) if m} - set(
      range(num_layers or 0)))
  fix = (f"fix {config_file} so that it describes the weights (or copy or download the "
         "checkpoint again)")
  if num_layers is not None and more and more == list(range(num_layers, more[-1] + 1)):
    field = "num_layers" if config_file == NATIVE_CONFIG else "num_hidden_layers"
    fix = (f"the weights hold {more[-1] + 1} layers where {config_file} says "
           f"{field}={num_layers}: {fix}")
  elif foreign:
    fix = f"no such model has the unused ones: remove them from the file, or {fix}"
  raise CheckpointMismatchError(f"{source} does not match {model} of its {config_file}: "
                                f"{'; '.join(problems)}. {fix[0].upper()}{fix[1:]}.")


def _few(label: str, names: list[str], shown: int = 5) -> str:
  """"label (count): the first `shown` names, ..." for a one-line message."""
  return f"{label} ({len(names)}): {', '.join(names[:shown])}{', ...' if len(names) > shown else ''}"


def warn_left_out(source: str, model: str, names: Iterable[str],
                  origin: Mapping[str, str] | None = None) -> None:
  """The one warning naming the tensors of `source` (other tasks' heads) that `model`
  (describe_model) does not use, as the file names them."""
  names = sorted(file_names(names, origin))
  if names:
    logging.warning("%s: %d tensors that %s does not use are left out: %s", source,
                    len(names), model, ", ".join(names))


# transformers' task heads -> ours (checkpoints read as "all"): a sequence classifier's dense
# layer (RoBERTa's, ELECTRA's classification head) is our pooler and its out_proj our
# classifier; token, span and choice heads map to the classifier as they are.
TASK_HEADS = ("classifier.out_proj", "classifier", "qa_outputs")


def pop_task_head(state: dict[str, Array]) -> Params:
  """In place on a canonical state: the classification head's dense moved to pooler.dense,
  and the task head's output layer taken out as our `classifier` ({} when there is none)."""
  for name in ("weight", "bias"):
    if f"classifier.dense.{name}" in state:
      state[f"pooler.dense.{name}"] = state.pop(f"classifier.dense.{name}")
  hf = next((h for h in TASK_HEADS if f"{h}.weight" in state), None)
  if hf is None:
    return {}
  return {"kernel": np.ascontiguousarray(np.asarray(state.pop(f"{hf}.weight"), np.float32).T),
          "bias": np.asarray(state.pop(f"{hf}.bias"), np.float32)}


# The kinds of fine-tuned head (`classifier`, whose tree is the same for each) -> the suffix
# of transformers' class that holds it. A task head's kind is not in its tree: a fine-tuning
# run's best/ records its task, a HuggingFace directory its class, an export its metadata.
TASK_HEAD_CLASSES = {"sequence": "ForSequenceClassification", "token": "ForTokenClassification",
                     "span": "ForQuestionAnswering", "choice": "ForMultipleChoice"}


def task_head_of_architecture(architecture: str) -> str | None:
  """The kind of task head transformers' class `architecture` holds (None: not a task's)."""
  return next((k for k, suffix in TASK_HEAD_CLASSES.items() if architecture.endswith(suffix)),
              None)


def task_head_to_hf(state: dict[str, Array], head: Params, pooler: str,
                    names: tuple[str | None, str]) -> None:
  """In place on a HuggingFace state: our pooler (named `pooler` in `state`) and classifier
  as transformers' task head `names` = (its dense layer before the output: our pooler, or
  None where the class has none, e.g. a token or span head, and the pooler such a head
  never reads is left out; its output layer)."""
  dense, out = names
  if dense is not None and f"{pooler}.weight" not in state:
    raise CheckpointMismatchError(
        f"transformers' head of this task reads a dense layer ({dense}) that the checkpoint "
        "lacks (it has no pooler): export the fine-tuning run's best/, which records its "
        "task, or the encoder alone (--target=encoder).")
  for name in ("weight", "bias"):
    value = state.pop(f"{pooler}.{name}", None)
    if dense is not None and value is not None:
      state[f"{dense}.{name}"] = value
  state[f"{out}.weight"] = np.ascontiguousarray(np.asarray(head["kernel"], np.float32).T)
  state[f"{out}.bias"] = np.asarray(head["bias"], np.float32)


def task_head_names(pooler: str, sequence: tuple[str | None, str] | None = None,
                    choice: str | None = None) -> dict[str, tuple[str | None, str]]:
  """A family's task_head_to_hf names per kind: transformers' common ones (a token or span
  head on the encoder alone; a sequence or choice classifier on the pooler, `pooler`),
  where the family's sequence head (dense, output) or choice head's dense differs."""
  return {"sequence": sequence or (pooler, "classifier"), "token": (None, "classifier"),
          "span": (None, "qa_outputs"), "choice": (choice or pooler, "classifier")}


def label_fields(params: Params) -> dict[str, Any]:
  """config.json's id2label / label2id for a tree with a classifier ({} without one)."""
  if "classifier" not in params:
    return {}
  labels = params["classifier"]["kernel"].shape[-1]
  return {"id2label": {str(i): f"LABEL_{i}" for i in range(labels)},
          "label2id": {f"LABEL_{i}": i for i in range(labels)}}


def canonical_target(target: str) -> str:
  """A reader's target for the canonical table ("all", an export's whole tree, reads as
  "pretraining")."""
  return "pretraining" if target == "all" else target


# ----------------------------------------------------------------------------
# Writers.

def save_native(path: str, cfg: Any, params: Params, task_head: str | None = None) -> None:
  """Our portable format: safetensors of the unrolled tree + the model config (written last:
  a directory without it is not a checkpoint, so a killed save is never read). `task_head`:
  the kind of the `classifier` the tree holds (TASK_HEAD_CLASSES), kept in the safetensors
  metadata for an export to transformers (native_task_head)."""
  params = to_numpy(params)
  flat = {"/".join(p.key for p in path): np.ascontiguousarray(v)
          for path, v in jax.tree_util.tree_flatten_with_path(params)[0]}
  d = fileio.path(path)
  d.mkdir(parents=True, exist_ok=True)
  write_safetensors(d / NATIVE_PARAMS, flat, {"task_head": task_head} if task_head else None)
  (d / NATIVE_CONFIG).write_text(json.dumps(cfg.to_dict(), indent=2))


def native_task_head(path: str) -> str | None:
  """The task head's kind an export recorded (save_native), None where it holds none; only
  the safetensors header is read."""
  try:
    with (fileio.path(path) / NATIVE_PARAMS).open("rb") as f:
      size = int.from_bytes(f.read(8), "little")
      header = json.loads(f.read(size)) if 0 < size < 100_000_000 else {}
  except (OSError, ValueError):
    return None  # (a damaged file is named by the reader)
  kind = (header.get("__metadata__") or {}).get("task_head") if isinstance(header, dict) else None
  return kind if kind in TASK_HEAD_CLASSES else None


# How a job computed the model, not what the model is: a saved config's values are not
# carried to the jobs that read it (a GPU pre-training job's fused attention, its FP8 matmuls:
# fine-tuning, predict and exports run the defaults of their own backend and config).
RUNTIME_FIELDS = ("attention_impl", "matmul_dtype")


def config_from_dict(d: Mapping[str, Any]) -> Any:
  """A model config saved as a dict (an export's, a run's) -> its family's config class
  (a dict without "family" is BERT's), RUNTIME_FIELDS left at their defaults."""
  d = {k: v for k, v in d.items() if k not in RUNTIME_FIELDS}
  return families.get(d.get("family", "bert")).config.from_dict(d)


def vocabulary_fits(cfg: Any, size: int) -> bool:
  """Whether a vocabulary of `size` entries serves the model: BERT's table has exactly one
  row per entry; the modern encoders' tables are padded (ModernBERT: 50368 rows, 50280
  tokens), so a vocabulary up to the table's size fits."""
  return size <= cfg.vocab_size if families.of(cfg).padded_vocab else size == cfg.vocab_size


def native_config(path: str) -> Any:
  """The model config of a bert_jax export (its config file alone)."""
  return config_from_dict(json.loads((fileio.path(path) / NATIVE_CONFIG).read_text()))


def read_native(path: str) -> tuple[Any, Params]:
  """(config, the saved parameter tree as it is: any heads, e.g. a fine-tuned classifier)
  of a bert_jax export."""
  d = fileio.path(path)
  cfg = native_config(path)
  params: Params = {}
  for key, value in _read_safetensors(d / NATIVE_PARAMS).items():
    set_path(params, tuple(key.split("/")), value)
  _check_native_encoder(path, cfg, params)
  return cfg, params


def _check_native_encoder(path: str, cfg: Any, params: Params) -> None:
  """An export's encoder against the one its bert_jax_config.json describes, as every reader
  checks a checkpoint (check_read): a layer more than the config says, a tensor no such
  encoder has, a missing or wrongly shaped one is refused in one line."""
  module = families.of(cfg).encoder(cfg.replace(scan_layers=False), add_pooler=True)
  ids = np.zeros((1, 2), np.int32)
  want = _flat(jax.eval_shape(lambda: nn.unbox(module.init(jax.random.key(0), ids, ids, ids))))
  want = {k[1:]: v.shape for k, v in want.items() if k[0] == "params"}
  prefix = "bert/" if "bert" in params else ""
  got = {k: np.shape(v) for k, v in _flat(params.get("bert", params)).items()}
  name = lambda k: prefix + "/".join(k)
  check_read(f"bert_jax export {path}", describe_model(cfg, "encoder"),
             missing=[name(k) for k in want if k not in got and k[0] not in ("pooler", "head")],
             bad_shape=[f"{name(k)}: {s}" for k, s in got.items()
                        if k in want and tuple(s) != tuple(want[k])],
             unused=[name(k) for k in got if k not in want], heads=(),
             num_layers=cfg.num_layers, config_file=NATIVE_CONFIG)


def _flat(tree: Mapping) -> dict[tuple[str, ...], Any]:
  """{key path: leaf} of a nested dict."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      out.update({(key,) + k: v for k, v in _flat(value).items()})
    else:
      out[(key,)] = value
  return out


def read_native_tree(path: str, target: str = "pretraining", require_mlm: bool = True
                     ) -> tuple[Any, Params]:
  """A bert_jax export of a family without a canonical dict (DeBERTa, the modern encoders):
  its tree as saved ("all"), the encoder alone ("encoder"), or without a task's head."""
  del require_mlm
  cfg, params = read_native(path)
  if target == "all":
    return cfg, params
  return cfg, params["bert"] if target == "encoder" else {
      k: v for k, v in params.items() if k != "classifier"}


