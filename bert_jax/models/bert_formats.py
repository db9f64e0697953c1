"""BERT's checkpoint formats: HuggingFace (safetensors / pytorch_model.bin), Google TF
checkpoints (bert_jax/models/bert_tf_checkpoint.py) and bert_jax exports <-> BERT's parameter
trees on the host, and BERT's Family record (bert_jax/families.py). RoBERTa and ELECTRA read
and write through the same table (their names renamed to BERT's first).

Every format is first brought to one canonical flat dict, HuggingFace's names without the
`bert.` prefix in PyTorch layout (`encoder.layer.0.attention.self.query.weight` [out, in]);
one table (`_rules`) maps those names onto our parameter tree. Every import is checked:
shapes must match and every tensor must be used, or the import fails naming the offending
tensors. Nothing is re-initialised. Trees here are in the unrolled layout (`encoder/
layer_i`); the helpers every family's format shares are bert_jax/formats.py's.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import families
from bert_jax import formats
from bert_jax.formats import CheckpointMismatchError, CheckpointNotFoundError, Params
from bert_jax.models import bert as model_lib
from bert_jax.models import bert_attention
from bert_jax.models import bert_tf_checkpoint
from bert_jax.models.bert import BertConfig
from common import errors
from common import fileio

Array = np.ndarray

HF_TANH_ACTS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


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


# ----------------------------------------------------------------------------
# Canonical dict <-> params.

def canonical_to_params(state: Mapping[str, Array], cfg: BertConfig, target: str = "pretraining",
                        source: str = "checkpoint", require_mlm: bool = True,
                        origin: Mapping[str, str] | None = None,
                        heads: tuple[str, ...] = formats.HEADS,
                        config_file: str = "config.json") -> Params:
  """Maps a canonical flat dict onto the param tree of `target`; fails on any mismatch.

  The encoder must be complete. The pooler, the masked-LM head and the NSP head are each
  loaded when the checkpoint has them (a part present only in part is an error), so one
  call reads BertForPreTraining, BertForMaskedLM and BertModel checkpoints; see `heads`.
  target="pretraining" with `require_mlm` fails without the masked-LM head. Tensors of no
  part under `heads` (another task's head, e.g. `cls.extra.*` or `classifier.*`; the heads
  when target="encoder") are named in one warning and left out; any other unused tensor
  (a layer more than `config_file` says, a tensor BERT has not) is an error, as every
  family's (formats.check_read). Messages name tensors as the file does (`origin`:
  canonical name -> the file's, formats.file_names).
  """
  state = formats.untie_decoder(dict(state), source, origin)
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
      bad_shape.append(f"{formats.file_names([hf], origin)[0]}: {state[hf].shape}")
      continue
    formats.set_path(params, path, value)
  model = formats.describe_model(cfg, target)
  left_out = formats.check_read(
      source, model, missing=missing, bad_shape=bad_shape,
      unused=[k for k in state if k not in used], heads=heads, origin=origin,
      num_layers=cfg.num_layers, config_file=config_file)
  if target == "pretraining" and require_mlm and not any(present["mlm"]):
    raise CheckpointMismatchError(
        f"{source} has no masked-LM head (cls.predictions.*): it is an encoder-only "
        "checkpoint (BertModel). Load it with target='encoder' (fine-tuning, features); "
        "fill-mask needs a BertForMaskedLM or BertForPreTraining checkpoint.")
  formats.warn_left_out(source, model, left_out, origin)
  _check_shapes(params, cfg, target)
  return params


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
      got = formats.get_path(params, keys).shape
    except KeyError:
      continue  # an optional part that is absent
    if tuple(got) != tuple(leaf.shape):
      wrong.append(f"{'/'.join(keys)}: got {tuple(got)}, expected {tuple(leaf.shape)}")
  if wrong:
    raise CheckpointMismatchError("Tensors of the wrong shape for the config:\n  " + "\n  ".join(wrong))


def params_to_canonical(params: Params, cfg: BertConfig) -> dict[str, Array]:
  """Param tree (any heads, unrolled) -> canonical flat dict of what it holds."""
  params = formats.to_numpy(params)
  target = "pretraining" if "bert" in params else "encoder"
  have = dict(formats.heads(params), encoder=True)
  return {hf: np.ascontiguousarray(to_hf(np.asarray(formats.get_path(params, path),
                                                    np.float32)))
          for hf, path, _, to_hf, part in _rules(cfg, target) if have[part]}


# ----------------------------------------------------------------------------
# Configs and readers.

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


def read_hf(path: str, target: str = "pretraining", require_mlm: bool = True
            ) -> tuple[BertConfig, Params]:
  """A HuggingFace BERT directory (config.json + model.safetensors / pytorch_model.bin);
  "all" also reads a task head (sequence or token classification, spans, multiple choice)."""
  cfg = config_from_hf(formats.read_config_json(fileio.path(path) / "config.json"))
  origin = {}
  state = formats.read_hf_state(path, origin)
  head = formats.pop_task_head(state) if target == "all" else {}
  params = canonical_to_params(state, cfg, formats.canonical_target(target),
                               require_mlm=require_mlm and not head,
                               source=f"HuggingFace checkpoint {path}", origin=origin)
  return cfg, {**params, "classifier": head} if head else params


def google_config(path: Any) -> BertConfig:
  """The config of a Google TF checkpoint's bert_config.json at `path`."""
  hf = formats.read_config_json(path)
  # Google's TF code implements "gelu" with the tanh approximation.
  if hf.get("hidden_act") == "gelu":
    hf = {**hf, "hidden_act": "gelu_new"}
  return config_from_hf(hf)


def read_tf(path: str, target: str = "pretraining", require_mlm: bool = True
            ) -> tuple[BertConfig, Params] | None:
  """(config, unrolled params) of a Google TF checkpoint at `path` (bert_model.ckpt.index and
  bert_config.json beside it); None when `path` holds none."""
  ckpt = bert_tf_checkpoint.find_checkpoint(path)
  if ckpt is None:
    return None
  config_path = fileio.path(ckpt).parent / "bert_config.json"
  if not config_path.exists():
    raise CheckpointNotFoundError(f"TF checkpoint {ckpt} has no bert_config.json beside it.")
  cfg = google_config(config_path)
  origin = {}
  return cfg, canonical_to_params(bert_tf_checkpoint.read_tf_state(ckpt, origin), cfg,
                                  formats.canonical_target(target), require_mlm=require_mlm,
                                  source=f"TF checkpoint {ckpt}", origin=origin,
                                  heads=formats.HEADS + bert_tf_checkpoint.HEADS,
                                  config_file="bert_config.json")


# ----------------------------------------------------------------------------
# Writers and the Family record.

def load_native(path: str, target: str = "pretraining", require_mlm: bool = True
                ) -> tuple[BertConfig, Params]:
  """An export read through the canonical dict, so the same checks apply ("all": as saved)."""
  if target == "all":
    return formats.read_native(path)
  cfg, params = formats.read_native(path)
  state = params_to_canonical(params, cfg)
  return cfg, canonical_to_params(state, cfg, target, require_mlm=require_mlm,
                                  source=f"bert_jax export {path}",
                                  config_file=formats.NATIVE_CONFIG)


# transformers' names of a fine-tuned head, per kind (formats.task_head_to_hf).
TASK_HEADS = formats.task_head_names("bert.pooler.dense")


def export_huggingface(path: str, cfg: BertConfig, params: Params,
                       task_head: str = "sequence") -> None:
  """safetensors + config.json for the transformers class of the heads the params hold:
  BertForPreTraining (MLM + NSP), BertForMaskedLM (MLM only), BertModel (encoder), or with a
  fine-tuned `classifier` the class of its kind, `task_head` (formats.TASK_HEAD_CLASSES:
  BertForSequenceClassification, ...). config.json is written last: a directory without it
  is not read as a checkpoint."""
  h = formats.heads(params)
  head = params.get("classifier")
  architecture = ("Bert" + formats.TASK_HEAD_CLASSES[task_head] if head is not None
                  else ARCHITECTURES[(h["mlm"], h["nsp"])])
  canonical = params_to_canonical(params, cfg)
  if architecture == "BertModel":  # as transformers saves a BertModel: no prefix
    state = canonical
  else:
    state = {(k if k.startswith("cls.") else "bert." + k): v for k, v in canonical.items()}
  if head is not None:
    formats.task_head_to_hf(state, head, "bert.pooler.dense", TASK_HEADS[task_head])
  config = {**config_to_hf(cfg, architecture), **formats.label_fields(params)}
  d = fileio.path(path)
  d.mkdir(parents=True, exist_ok=True)
  formats.write_safetensors(d / "model.safetensors", state, metadata={"format": "pt"})
  (d / "config.json").write_text(json.dumps(config, indent=2))


# What the jobs need of BERT (bert_jax/families.py).
ARCHITECTURE_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads",
                       "intermediate_size", "max_position_embeddings", "type_vocab_size",
                       "hidden_act", "layer_norm_eps")
FAMILIES = {"bert": families.Family(
    name="bert", config=BertConfig, from_fields=model_lib.config_from_fields,
    encoder=model_lib.BertModel,
    masked_lm=lambda cfg, nsp: model_lib.BertForPreTraining(cfg, nsp=nsp),
    causal_lm=lambda cfg: model_lib.BertForCausalLM(cfg.replace(causal=True)),
    read_hf=read_hf, config_from_hf=config_from_hf, read_native=load_native,
    export_hf=lambda path, cfg, params, tokenizer=None, task_head="sequence": (
        export_huggingface(path, cfg, params, task_head)),
    model_types=("bert",), architecture_fields=ARCHITECTURE_FIELDS,
    dropout={"hidden_dropout_rate": 0.1, "attention_dropout_rate": 0.1},  # the paper's
    forward_flops=model_lib.forward_flops, hf_pooler=True,
    gpu_defaults=bert_attention.gpu_defaults)}
