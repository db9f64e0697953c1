"""BERT's checkpoint formats and name tables: HuggingFace (safetensors / pytorch_model.bin),
Google TF checkpoints (bert_jax/models/bert_tf_checkpoint.py) and bert_jax exports <-> bert_jax
parameter trees, on the host.

Every format is first brought to one canonical flat dict, HuggingFace's names without the
`bert.` prefix in PyTorch layout (`encoder.layer.0.attention.self.query.weight` [out, in]);
one table (`_rules`) maps those names onto our parameter tree. Every import is checked:
shapes must match and every tensor must be used, or the import fails naming the offending
tensors. Nothing is re-initialised. Trees here are in the unrolled layout (`encoder/
layer_i`); bert_jax/loader.py, the one way weights enter a model, converts layouts, checks
fit and finiteness, and reads our own runs. `python -m bert_jax.convert` writes exports.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import re
from typing import Any, Callable, Mapping

from absl import logging
from etils import epath
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy

from bert_jax import families
from bert_jax import flops
from bert_jax.models import bert as model_lib
from bert_jax.models import bert_tf_checkpoint
from bert_jax.models.bert import BertConfig
from input_pipeline import errors
from input_pipeline import fileio

Array = np.ndarray
Params = dict[str, Any]

NATIVE_CONFIG = "bert_jax_config.json"
NATIVE_PARAMS = "params.safetensors"
# Tensors a checkpoint may hold that carry no weights of ours.
_IGNORED = re.compile(r"^(embeddings\.position_ids|embeddings\.token_type_ids)$")

HF_TANH_ACTS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


class CheckpointMismatchError(errors.UserError, ValueError):
  """A checkpoint's tensors do not match the model (or its config.json): names them all."""


class CheckpointNotFoundError(errors.UserError, FileNotFoundError):
  """The path given as a checkpoint does not exist or holds no checkpoint bert_jax reads."""


class CorruptCheckpointFileError(errors.UserError, ValueError):
  """A checkpoint file that cannot be read (truncated or corrupt): names the file."""


# ----------------------------------------------------------------------------
# The one mapping table: canonical (HF, no prefix) name <-> our param path.

def _t(x: Array) -> Array:
  return np.ascontiguousarray(x.T)


# The parts a BERT checkpoint may hold: the encoder (always), the pooler, the masked-LM
# head (cls.predictions.*) and the next-sentence head (cls.seq_relationship.*). A part is
# loaded whole or not at all.
PARTS = ("encoder", "pooler", "mlm", "nsp")
# HuggingFace's architecture name for each set of heads (export).
ARCHITECTURES = {(True, True): "BertForPreTraining", (True, False): "BertForMaskedLM",
                 (False, False): "BertModel", (False, True): "BertForPreTraining"}


def _rules(cfg: BertConfig, target: str) -> list[tuple[str, tuple[str, ...], Callable, Callable, str]]:
  """(hf_name, flax_path, hf->flax, flax->hf, part) for every parameter of the model.

  target "pretraining": the tree of BertForPreTraining (encoder under `bert`, heads at the
  top); "encoder": the tree of BertModel (no heads).
  """
  if target not in ("pretraining", "encoder"):
    raise ValueError(f"target must be 'pretraining' or 'encoder', got {target!r}.")
  D, H, K = cfg.hidden_size, cfg.num_heads, cfg.head_dim
  same = (lambda x: x, lambda x: x)
  dense = (_t, _t)
  qkv_w = (lambda w: _t(w).reshape(D, H, K), lambda k: _t(k.reshape(D, D)))
  qkv_b = (lambda b: b.reshape(H, K), lambda b: b.reshape(D))
  out_w = (lambda w: _t(w).reshape(H, K, D), lambda k: _t(k.reshape(D, D)))
  rules = []
  part = "encoder"

  def add(hf, path, fns):
    rules.append((hf, path, *fns, part))

  def layer_norm(hf, path):
    add(hf + ".weight", path + ("scale",), same)
    add(hf + ".bias", path + ("bias",), same)

  def linear(hf, path, w=dense, b=same):
    add(hf + ".weight", path + ("kernel",), w)
    add(hf + ".bias", path + ("bias",), b)

  root = ("bert",) if target == "pretraining" else ()
  emb = root + ("embeddings",)
  for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
    add(f"embeddings.{name}.weight", emb + (name, "embedding"), same)
  layer_norm("embeddings.LayerNorm", emb + ("LayerNorm",))
  if cfg.embedding_dim != cfg.hidden_size:  # ELECTRA's projection to the hidden size
    linear("embeddings_project", root + ("embeddings_project",))
  for i in range(cfg.num_layers):
    hf, path = f"encoder.layer.{i}", root + ("encoder", f"layer_{i}")
    for name in ("query", "key", "value"):
      linear(f"{hf}.attention.self.{name}", path + ("attention", name), qkv_w, qkv_b)
    linear(f"{hf}.attention.output.dense", path + ("attention", "output"), out_w)
    layer_norm(f"{hf}.attention.output.LayerNorm", path + ("attention_LayerNorm",))
    linear(f"{hf}.intermediate.dense", path + ("intermediate",))
    linear(f"{hf}.output.dense", path + ("output",))
    layer_norm(f"{hf}.output.LayerNorm", path + ("output_LayerNorm",))
  part = "pooler"
  linear("pooler.dense", root + ("pooler",))
  if target == "pretraining":
    part = "mlm"
    linear("cls.predictions.transform.dense", ("transform",))
    layer_norm("cls.predictions.transform.LayerNorm", ("transform_LayerNorm",))
    add("cls.predictions.bias", ("output_bias",), same)
    part = "nsp"
    linear("cls.seq_relationship", ("seq_relationship",))
  return rules


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
# Canonical dict <-> params.

def canonical_to_params(state: Mapping[str, Array], cfg: BertConfig, target: str = "pretraining",
                        source: str = "checkpoint", require_mlm: bool = True) -> Params:
  """Maps a canonical flat dict onto the param tree of `target`; fails on any mismatch.

  The encoder must be complete. The pooler, the masked-LM head and the NSP head are each
  loaded when the checkpoint has them (a part present only in part is an error), so one
  call reads BertForPreTraining, BertForMaskedLM and BertModel checkpoints; see `heads`.
  target="pretraining" with `require_mlm` fails without the masked-LM head. Tensors of no
  part (another task's head, e.g. `cls.extra.*` or `classifier.*`; the heads when
  target="encoder") are named in one warning and left out; unknown tensors inside the
  encoder's namespaces (embeddings., encoder., pooler.) are an error.
  """
  state = _untie_decoder(dict(state), source)
  rules = _rules(cfg, target)
  present = {part: [hf in state for hf, *_, p in rules if p == part] for part in PARTS}
  loaded = {part: part == "encoder" or (bool(flags) and all(flags))
            for part, flags in present.items()}
  params: Params = {}
  missing, bad_shape, used = [], [], set()
  for hf, path, to_flax, _, part in rules:
    if not loaded[part] and not any(present[part]):
      continue  # an optional part the checkpoint does not have
    if hf not in state:
      missing.append(hf)
      continue
    used.add(hf)
    value = np.asarray(state[hf], dtype=np.float32)
    try:
      value = to_flax(value)
    except ValueError:
      bad_shape.append(f"{hf}: {state[hf].shape}")
      continue
    set_path(params, path, value)
  unused = sorted(k for k in state if k not in used and not _IGNORED.match(k))
  structural = [k for k in unused if k.startswith(("embeddings.", "encoder.", "pooler."))]
  no_mlm = target == "pretraining" and require_mlm and not any(present["mlm"])
  if missing or bad_shape or structural or no_mlm:
    raise _mismatch(f"{source} does not match a {target} BERT of config {cfg.to_dict()}:",
                    missing, bad_shape, unused,
                    no_mlm=no_mlm and not (missing or bad_shape or structural))
  if unused:
    logging.warning("%s: %d tensors that a %s BERT does not use are left out: %s",
                    source, len(unused), target, ", ".join(unused))
  _check_shapes(params, cfg, target)
  return params


def _untie_decoder(state: dict[str, Array], source: str) -> dict[str, Array]:
  """`state` without the MLM decoder's copies of the word embeddings and the output bias
  (tied: accepted only when they really are the same tensors), in place."""
  for dup, orig in (("cls.predictions.decoder.weight", "embeddings.word_embeddings.weight"),
                    ("cls.predictions.decoder.bias", "cls.predictions.bias")):
    if dup in state:
      if orig in state and state[orig].shape == state[dup].shape and np.array_equal(state[orig], state[dup]):
        del state[dup]
      elif orig not in state and dup.endswith("bias"):
        state[orig] = state.pop(dup)
      else:
        raise CheckpointMismatchError(
            f"{source}: {dup} differs from {orig}; bert_jax ties the MLM output "
            "projection to the word embeddings and cannot load an untied one.")
  return state


def _mismatch(headline: str, missing: list[str], bad_shape: list[str], unused: list[str],
              no_mlm: bool) -> CheckpointMismatchError:
  """The error naming every tensor that keeps a checkpoint from loading."""
  lines = [headline]
  if missing:
    lines.append(f"  missing tensors ({len(missing)}): {', '.join(missing)}")
  if bad_shape:
    lines.append(f"  tensors of the wrong shape ({len(bad_shape)}): {', '.join(bad_shape)}")
  if unused:
    lines.append(f"  unused tensors ({len(unused)}): {', '.join(unused)}")
  if no_mlm:
    lines.append("  The checkpoint has no masked-LM head (cls.predictions.*): it is an "
                 "encoder-only checkpoint (BertModel). Load it with target='encoder' "
                 "(fine-tuning, features); fill-mask needs a BertForMaskedLM or "
                 "BertForPreTraining checkpoint.")
  return CheckpointMismatchError("\n".join(lines))


def _check_shapes(params: Params, cfg: BertConfig, target: str) -> None:
  """Compares every tensor with the shape the model (with all its heads) expects."""
  module = model_lib.BertForPreTraining(cfg) if target == "pretraining" else model_lib.BertModel(cfg)
  ids = jnp.zeros((1, 1), jnp.int32)
  args = (ids, ids, ids, ids) if target == "pretraining" else (ids,)
  expected = jax.eval_shape(lambda: nn.unbox(module.init(jax.random.key(0), *args))["params"])
  wrong = []
  flat_expected = jax.tree_util.tree_flatten_with_path(expected)[0]
  for path, leaf in flat_expected:
    keys = tuple(p.key for p in path)
    try:
      got = get_path(params, keys).shape
    except KeyError:
      continue  # an optional part that is absent
    if tuple(got) != tuple(leaf.shape):
      wrong.append(f"{'/'.join(keys)}: got {tuple(got)}, expected {tuple(leaf.shape)}")
  if wrong:
    raise CheckpointMismatchError("Tensors of the wrong shape for the config:\n  " + "\n  ".join(wrong))


def params_to_canonical(params: Params, cfg: BertConfig) -> dict[str, Array]:
  """Param tree (any heads, unrolled) -> canonical flat dict of what it holds."""
  params = to_numpy(params)
  target = "pretraining" if "bert" in params else "encoder"
  have = dict(heads(params), encoder=True)
  return {hf: np.ascontiguousarray(to_hf(np.asarray(get_path(params, path), np.float32)))
          for hf, path, _, to_hf, part in _rules(cfg, target) if have[part]}


# ----------------------------------------------------------------------------
# Configs.

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


def config_from_hf(hf: Mapping[str, Any], **overrides) -> BertConfig:
  if hf.get("position_embedding_type", "absolute") != "absolute":
    raise errors.ConfigError(
        f"position_embedding_type={hf['position_embedding_type']!r} is not supported; "
        "bert_jax implements BERT's learned absolute positions.")
  act = hf.get("hidden_act", "gelu")
  act = "gelu_tanh" if act in HF_TANH_ACTS else act
  return BertConfig(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
      num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
      intermediate_size=hf["intermediate_size"],
      max_position_embeddings=hf.get("max_position_embeddings", 512),
      type_vocab_size=hf.get("type_vocab_size", 2), hidden_act=act,
      hidden_dropout_rate=hf.get("hidden_dropout_prob", 0.1),
      attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
      layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
      initializer_range=hf.get("initializer_range", 0.02)).replace(**overrides)


def config_to_hf(cfg: BertConfig, architecture: str = "BertForPreTraining") -> dict[str, Any]:
  return {
      "architectures": [architecture], "model_type": "bert",
      "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
      "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
      "intermediate_size": cfg.intermediate_size,
      "max_position_embeddings": cfg.max_position_embeddings,
      "type_vocab_size": cfg.type_vocab_size,
      "hidden_act": "gelu_new" if cfg.hidden_act == "gelu_tanh" else cfg.hidden_act,
      "hidden_dropout_prob": cfg.hidden_dropout_rate,
      "attention_probs_dropout_prob": cfg.attention_dropout_rate,
      "layer_norm_eps": cfg.layer_norm_eps, "initializer_range": cfg.initializer_range,
      "position_embedding_type": "absolute", "pad_token_id": 0, "tie_word_embeddings": True,
  }


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


def read_hf_state(path: str) -> dict[str, Array]:
  """model.safetensors (sharded too) or pytorch_model.bin, `bert.` prefix stripped."""
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
  return canonical_names(state)


def canonical_names(state: Mapping[str, Array]) -> dict[str, Array]:
  out = {}
  for name, value in state.items():
    name = name.removeprefix("bert.")
    if "LayerNorm" in name:  # Old checkpoints name LayerNorm params gamma/beta.
      name = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", name))
    out[name] = np.asarray(value)
  return out


def read_foreign(path: str, target: str = "pretraining", *, require_mlm: bool = True
                 ) -> tuple[BertConfig, Params]:
  """(config, unrolled params on the host) of a bert_jax export, a HuggingFace directory or
  a Google TF checkpoint. The params hold the heads the checkpoint has (`heads(params)`
  says which): target "pretraining" reads BertForPreTraining and BertForMaskedLM
  checkpoints (and, with require_mlm=False, encoder-only ones), "encoder" the encoder
  (+ pooler) of any; "all" an export's tree as saved (a fine-tuned head included)."""
  d = fileio.path(path)
  if (d / NATIVE_CONFIG).exists():
    cfg = config_from_dict(json.loads((d / NATIVE_CONFIG).read_text()))
    return families.of(cfg).read_native(path, target, require_mlm)
  family = families.of_hf_dir(path)
  if family is not None:
    return family.read_hf(path, target, require_mlm)
  ckpt = bert_tf_checkpoint.find_checkpoint(path)
  if ckpt is not None:
    config_path = fileio.path(ckpt).parent / "bert_config.json"
    if not config_path.exists():
      raise CheckpointNotFoundError(f"TF checkpoint {ckpt} has no bert_config.json beside it.")
    hf = read_config_json(config_path)
    # Google's TF code implements "gelu" with the tanh approximation.
    if hf.get("hidden_act") == "gelu":
      hf = {**hf, "hidden_act": "gelu_new"}
    cfg = config_from_hf(hf)
    return cfg, canonical_to_params(bert_tf_checkpoint.read_tf_state(ckpt), cfg,
                                    _canonical_target(target), require_mlm=require_mlm,
                                    source=f"TF checkpoint {ckpt}")
  raise CheckpointNotFoundError(
      f"{path} is not a checkpoint bert_jax can read: expected a directory with "
      f"{NATIVE_CONFIG} (bert_jax), config.json + model.safetensors/pytorch_model.bin "
      "(HuggingFace), or a TF checkpoint (bert_model.ckpt.index + bert_config.json).")


def read_hf(path: str, target: str = "pretraining", require_mlm: bool = True
            ) -> tuple[BertConfig, Params]:
  """A HuggingFace BERT directory (config.json + model.safetensors / pytorch_model.bin)."""
  cfg = config_from_hf(read_config_json(fileio.path(path) / "config.json"))
  return cfg, canonical_to_params(read_hf_state(path), cfg, _canonical_target(target),
                                  require_mlm=require_mlm, source=f"HuggingFace checkpoint {path}")


def renamed(state: Mapping[str, Array], pairs: tuple[tuple[str, str], ...], strip: str = "",
            add: str = "") -> dict[str, Array]:
  """`state` with each name that starts with a pair's first string starting with its second
  instead, and every other name without the prefix `strip` and with the prefix `add` (a
  family's HuggingFace names <-> BERT's canonical ones)."""
  out = {}
  for name, value in state.items():
    old = next((a for a, _ in pairs if name.startswith(a)), None)
    if old is None:
      out[add + name.removeprefix(strip)] = value
    else:
      out[dict(pairs)[old] + name[len(old):]] = value
  return out


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


def classifier_to_hf(state: dict[str, Array], head: Params, pooler: str) -> None:
  """In place on a HuggingFace state: our pooler (named `pooler`) and classifier as a
  ...ForSequenceClassification's classifier.dense / classifier.out_proj."""
  for name in ("weight", "bias"):
    state[f"classifier.dense.{name}"] = state.pop(f"{pooler}.{name}")
  state["classifier.out_proj.weight"] = np.ascontiguousarray(np.asarray(head["kernel"]).T)
  state["classifier.out_proj.bias"] = np.asarray(head["bias"])


def label_fields(params: Params) -> dict[str, Any]:
  """config.json's id2label / label2id for a tree with a classifier ({} without one)."""
  if "classifier" not in params:
    return {}
  labels = params["classifier"]["kernel"].shape[-1]
  return {"id2label": {str(i): f"LABEL_{i}" for i in range(labels)},
          "label2id": {f"LABEL_{i}": i for i in range(labels)}}


def _canonical_target(target: str) -> str:
  return "pretraining" if target == "all" else target


# ----------------------------------------------------------------------------
# Writers.

def save_native(path: str, cfg: BertConfig, params: Params) -> None:
  """Our portable format: safetensors of the unrolled tree + the BertConfig (written last:
  a directory without it is not a checkpoint, so a killed save is never read)."""
  params = to_numpy(params)
  flat = {"/".join(p.key for p in path): np.ascontiguousarray(v)
          for path, v in jax.tree_util.tree_flatten_with_path(params)[0]}
  d = fileio.path(path)
  d.mkdir(parents=True, exist_ok=True)
  write_safetensors(d / NATIVE_PARAMS, flat)
  (d / NATIVE_CONFIG).write_text(json.dumps(cfg.to_dict(), indent=2))


def config_from_dict(d: Mapping[str, Any]) -> Any:
  """A model config saved as a dict (an export's, a run's) -> its family's config class
  (a dict without "family" is BERT's)."""
  return families.get(d.get("family", "bert")).config.from_dict(d)


def vocabulary_fits(cfg: Any, size: int) -> bool:
  """Whether a vocabulary of `size` entries serves the model: BERT's table has exactly one
  row per entry; the modern encoders' tables are padded (ModernBERT: 50368 rows, 50280
  tokens), so a vocabulary up to the table's size fits."""
  return size <= cfg.vocab_size if families.of(cfg).padded_vocab else size == cfg.vocab_size


def read_native(path: str) -> tuple[Any, Params]:
  """(config, the saved parameter tree as it is: any heads, e.g. a fine-tuned classifier)
  of a bert_jax export."""
  d = fileio.path(path)
  cfg = config_from_dict(json.loads((d / NATIVE_CONFIG).read_text()))
  params: Params = {}
  for key, value in _read_safetensors(d / NATIVE_PARAMS).items():
    set_path(params, tuple(key.split("/")), value)
  return cfg, params


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


def load_native(path: str, target: str = "pretraining", require_mlm: bool = True
                ) -> tuple[BertConfig, Params]:
  """An export read through the canonical dict, so the same checks apply ("all": as saved)."""
  if target == "all":
    return read_native(path)
  cfg, params = read_native(path)
  state = params_to_canonical(params, cfg)
  return cfg, canonical_to_params(state, cfg, target, require_mlm=require_mlm,
                                  source=f"bert_jax export {path}")


def export_huggingface(path: str, cfg: BertConfig, params: Params) -> None:
  """safetensors + config.json for the transformers class of the heads the params hold:
  BertForPreTraining (MLM + NSP), BertForMaskedLM (MLM only) or BertModel (encoder).
  config.json is written last: a directory without it is not read as a checkpoint."""
  h = heads(params)
  architecture = ARCHITECTURES[(h["mlm"], h["nsp"])]
  canonical = params_to_canonical(params, cfg)
  if architecture == "BertModel":  # as transformers saves a BertModel: no prefix
    state = canonical
  else:
    state = {(k if k.startswith("cls.") else "bert." + k): v for k, v in canonical.items()}
  d = fileio.path(path)
  d.mkdir(parents=True, exist_ok=True)
  write_safetensors(d / "model.safetensors", state, metadata={"format": "pt"})
  (d / "config.json").write_text(json.dumps(config_to_hf(cfg, architecture), indent=2))


# What the jobs need of BERT (bert_jax/families.py).
ARCHITECTURE_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads",
                       "intermediate_size", "max_position_embeddings", "type_vocab_size",
                       "hidden_act", "layer_norm_eps")
FAMILIES = {"bert": families.Family(
    name="bert", config=BertConfig, from_fields=model_lib.config_from_fields,
    encoder=model_lib.BertModel, layer=model_lib.EncoderLayer,
    masked_lm=lambda cfg, nsp: model_lib.BertForPreTraining(cfg, nsp=nsp),
    causal_lm=lambda cfg: model_lib.BertForCausalLM(cfg.replace(causal=True)),
    read_hf=read_hf, read_native=load_native,
    export_hf=lambda path, cfg, params, tokenizer=None: export_huggingface(path, cfg, params),
    model_types=("bert",), architecture_fields=ARCHITECTURE_FIELDS,
    dropout={"hidden_dropout_rate": 0.1, "attention_dropout_rate": 0.1},  # the paper's
    forward_flops=flops.bert_forward_flops)}
