"""HuggingFace checkpoints of the modern encoders (model_type "modernbert": ModernBERT, Ettin,
mmBERT; "eurobert": EuroBERT) <-> bert_jax parameter trees (bert_jax/models/modern.py), on the host.

One table (`_rules`) maps transformers' names (the `model.` prefix stripped, PyTorch layout)
onto our tree; a rule may cut one tensor into several of ours (ModernBERT's fused `Wqkv` and
`Wi`). Every import is checked as formats.py checks BERT's: shapes match, every tensor is
used or named. Our tree keeps the encoder under `bert` (with the prediction head: ModernBERT's
`head.*`, EuroBERT's classifier `dense.*`, the part the loader calls the pooler), the masked-LM
output at the top (`decoder_bias`, or EuroBERT's untied `lm_head`) and a fine-tuned task's
`classifier` at the top.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Mapping

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import families
from bert_jax import formats
from bert_jax.models import modern
from bert_jax.models import modern_attention
from bert_jax.models.modern import GLOBAL, LOCAL, ModernConfig
from common import errors
from common import fileio

Array = np.ndarray
MODEL_TYPES = ("modernbert", "eurobert")
# transformers' architecture per (family, what the tree holds).
ARCHITECTURES = {
    ("modernbert", "mlm"): "ModernBertForMaskedLM", ("modernbert", "encoder"): "ModernBertModel",
    ("eurobert", "mlm"): "EuroBertForMaskedLM", ("eurobert", "encoder"): "EuroBertModel",
}
# The kinds of fine-tuned head transformers has a class of each family for.
TASK_HEADS = {"modernbert": tuple(formats.TASK_HEAD_CLASSES), "eurobert": ("sequence", "token")}
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id",
             "mask_token_id")
HF_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "intermediate_size")
# What the classes hold outside the encoder (its heads and task heads): left out, named,
# where a read does not use them; any other tensor is refused (formats.check_read).
HEADS = formats.HEADS + ("head.", "dense.", "decoder.", "lm_head.")


def _t(x: Array) -> Array:
  return np.ascontiguousarray(x.T)


class _Rule:
  """One transformers tensor <-> one or more of our leaves."""

  def __init__(self, hf: str, paths: tuple, load: Callable, save: Callable, part: str):
    self.hf, self.paths, self.load, self.save, self.part = hf, paths, load, save, part


class _Rules:
  """Builds a model's name table: `one`, `linear` and `norm` add rules for the current
  `part` (the loader's unit of a checkpoint: encoder, pooler, mlm, classifier)."""

  def __init__(self, cfg: ModernConfig):
    self.cfg, self.rules, self.part = cfg, [], "encoder"
    D, n, K = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    self.heads_in = lambda h: (lambda w: _t(w).reshape(D, h, K),
                               lambda k: _t(k.reshape(D, h * K)))
    self.out_in = (lambda w: _t(w).reshape(n, K, D), lambda k: _t(k.reshape(n * K, D)))

  def add(self, hf, paths, load, save):
    self.rules.append(_Rule(hf, paths, load, save, self.part))

  def one(self, hf, path, load=lambda x: x, save=lambda x: x):
    self.add(hf, (path,), lambda x: (load(x),), save)

  def linear(self, hf, path, kernel_load=_t, kernel_save=_t, bias=False):
    self.one(hf + ".weight", path + ("kernel",), kernel_load, kernel_save)
    if bias:
      self.one(hf + ".bias", path + ("bias",))

  def norm(self, hf, path):
    self.one(hf + ".weight", path + ("scale",))
    if self.cfg.norm_bias and self.cfg.norm == "layernorm":
      self.one(hf + ".bias", path + ("bias",))


def _modernbert_layer(b: _Rules, i: int, path: tuple) -> None:
  """ModernBERT's layer i: fused Wqkv and Wi split into our query/key/value, gate/up."""
  cfg = b.cfg
  H, G, K = cfg.num_heads, cfg.kv_heads, cfg.head_dim
  D = cfg.hidden_size
  hf, att, mlp = f"layers.{i}", path + ("attention",), path + ("mlp",)
  if i > 0 or cfg.first_attn_norm:
    b.norm(f"{hf}.attn_norm", path + ("attn_norm",))
  cuts = [H * K, (H + G) * K]
  b.add(f"{hf}.attn.Wqkv.weight", tuple(att + (n, "kernel") for n in ("query", "key", "value")),
        lambda w: tuple(_t(x).reshape(D, n, K) for x, n in zip(np.split(w, cuts), (H, G, G))),
        lambda *ks: np.concatenate([_t(k.reshape(D, -1)) for k in ks]))
  if cfg.attention_bias:
    b.add(f"{hf}.attn.Wqkv.bias", tuple(att + (n, "bias") for n in ("query", "key", "value")),
          lambda v: tuple(x.reshape(n, K) for x, n in zip(np.split(v, cuts), (H, G, G))),
          lambda *bs: np.concatenate([x.reshape(-1) for x in bs]))
  b.linear(f"{hf}.attn.Wo", att + ("output",), *b.out_in, bias=cfg.attention_bias)
  b.norm(f"{hf}.mlp_norm", path + ("mlp_norm",))
  b.add(f"{hf}.mlp.Wi.weight", (mlp + ("gate", "kernel"), mlp + ("up", "kernel")),
        lambda w: tuple(_t(x) for x in np.split(w, 2)),
        lambda g, u: np.concatenate([_t(g), _t(u)]))
  if cfg.mlp_bias:
    b.add(f"{hf}.mlp.Wi.bias", (mlp + ("gate", "bias"), mlp + ("up", "bias")),
          lambda v: tuple(np.split(v, 2)), lambda g, u: np.concatenate([g, u]))
  b.linear(f"{hf}.mlp.Wo", mlp + ("down",), bias=cfg.mlp_bias)


def _eurobert_layer(b: _Rules, i: int, path: tuple) -> None:
  """EuroBERT's (Llama-style) layer i: separate q/k/v/o and gate/up/down projections."""
  cfg = b.cfg
  K = cfg.head_dim
  hf, att = f"layers.{i}", path + ("attention",)
  b.norm(f"{hf}.input_layernorm", path + ("attn_norm",))
  for name, full, n in (("q", "query", cfg.num_heads), ("k", "key", cfg.kv_heads),
                        ("v", "value", cfg.kv_heads)):
    b.one(f"{hf}.self_attn.{name}_proj.weight", att + (full, "kernel"), *b.heads_in(n))
    if cfg.attention_bias:
      b.one(f"{hf}.self_attn.{name}_proj.bias", att + (full, "bias"),
            lambda v, n=n: v.reshape(n, K), lambda v: v.reshape(-1))
  b.linear(f"{hf}.self_attn.o_proj", att + ("output",), *b.out_in, bias=cfg.attention_bias)
  b.norm(f"{hf}.post_attention_layernorm", path + ("mlp_norm",))
  for name, ours in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
    b.linear(f"{hf}.mlp.{name}", path + ("mlp", ours), bias=cfg.mlp_bias)


def _rules(cfg: ModernConfig, classifier: int = 0) -> list[_Rule]:
  """Every tensor of a masked-LM model of `cfg` (and of a `classifier`-output task head)."""
  modern = cfg.family == "modernbert"
  b = _Rules(cfg)
  enc = ("bert",)
  if modern:
    b.one("embeddings.tok_embeddings.weight", enc + ("tok_embeddings", "embedding"))
    b.norm("embeddings.norm", enc + ("embedding_norm",))
  else:
    b.one("embed_tokens.weight", enc + ("tok_embeddings", "embedding"))
  layer = _modernbert_layer if modern else _eurobert_layer
  for i in range(cfg.num_layers):
    layer(b, i, enc + ("encoder", f"layer_{i}"))
  b.norm("final_norm" if modern else "norm", enc + ("final_norm",))
  b.part = "pooler"
  b.linear("head.dense" if modern else "dense", enc + ("head", "dense"), bias=cfg.head_bias)
  if cfg.head_norm:
    b.norm("head.norm", enc + ("head", "norm"))
  b.part = "mlm"
  out = "decoder" if modern else "lm_head"
  if cfg.tie_word_embeddings:
    if cfg.decoder_bias:
      b.one(f"{out}.bias", ("decoder_bias",))
  else:
    b.linear(out, ("lm_head",), bias=cfg.decoder_bias)
  if classifier:
    b.part = "classifier"
    b.linear("classifier", ("classifier",), bias=True)
  return b.rules


# ----------------------------------------------------------------------------
# Configs.

def _theta(hf: Mapping[str, Any], kind: str | None, legacy: str, default: float) -> float:
  """A rope theta from transformers' `rope_parameters` (per layer kind for ModernBERT) or
  the older top-level names; only the default rope type is implemented."""
  params = hf.get("rope_parameters") or {}
  if kind is not None:
    params = params.get(kind) or {}
  rope_type = params.get("rope_type", (hf.get("rope_scaling") or {}).get("rope_type", "default"))
  if rope_type != "default":
    raise errors.ConfigError(f"rope_type {rope_type!r} is not implemented; bert_jax implements "
                             "the default rotary embedding (set a new rope theta instead).")
  return float(params.get("rope_theta", hf.get(legacy, default)))


def config_from_hf(hf: Mapping[str, Any], **overrides) -> ModernConfig:
  """transformers' config.json of a ModernBERT or EuroBERT model -> ModernConfig."""
  model_type = hf.get("model_type")
  if model_type == "modernbert":
    n = hf["num_hidden_layers"]
    types = hf.get("layer_types") or [
        GLOBAL if i % hf.get("global_attn_every_n_layers", 3) == 0 else LOCAL for i in range(n)]
    every = next((e for e in range(1, n + 1) if all(
        (t == GLOBAL) == (i % e == 0) for i, t in enumerate(types))), None)
    if every is None:
      raise errors.ConfigError(f"layer_types {types} is not a periodic pattern (global at every "
                               "n-th layer from the first): bert_jax implements that pattern.")
    cfg = ModernConfig.from_preset(
        "modernbert-base", family="modernbert",
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=n,
        num_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
        hidden_act=hf.get("hidden_activation", "gelu"), norm_eps=hf.get("norm_eps", 1e-5),
        norm_bias=hf.get("norm_bias", False), attention_bias=hf.get("attention_bias", False),
        mlp_bias=hf.get("mlp_bias", False), global_every=every,
        local_window=hf.get("local_attention", 128),
        rope_theta=_theta(hf, GLOBAL, "global_rope_theta", 160000.0),
        local_rope_theta=_theta(hf, LOCAL, "local_rope_theta", 10000.0),
        max_position_embeddings=hf.get("max_position_embeddings", 8192),
        head_bias=hf.get("classifier_bias", False),
        head_act=hf.get("classifier_activation", "gelu"),
        tie_word_embeddings=hf.get("tie_word_embeddings", True),
        decoder_bias=hf.get("decoder_bias", True),
        classifier_pooling=hf.get("classifier_pooling", "cls"),
        embedding_dropout_rate=hf.get("embedding_dropout", 0.0),
        attention_dropout_rate=hf.get("attention_dropout", 0.0),
        mlp_dropout_rate=hf.get("mlp_dropout", 0.0),
        classifier_dropout_rate=hf.get("classifier_dropout", 0.0),
        initializer_range=hf.get("initializer_range", 0.02),
        initializer_cutoff_factor=hf.get("initializer_cutoff_factor") or 2.0)
  elif model_type == "eurobert":
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    if head_dim * heads != hf["hidden_size"]:
      raise errors.ConfigError(f"head_dim {head_dim} x {heads} heads != hidden_size "
                               f"{hf['hidden_size']}: bert_jax's attention needs them equal.")
    pooling = hf.get("classifier_pooling", "late")
    cfg = ModernConfig.from_preset(
        "eurobert-210m", family="eurobert",
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"], num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        intermediate_size=hf["intermediate_size"], hidden_act=hf.get("hidden_act", "silu"),
        norm_eps=hf.get("rms_norm_eps", 1e-5), attention_bias=hf.get("attention_bias", False),
        mlp_bias=hf.get("mlp_bias", False), decoder_bias=hf.get("mlp_bias", False),
        rope_theta=_theta(hf, None, "rope_theta", 250000.0),
        max_position_embeddings=hf.get("max_position_embeddings", 8192),
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
        classifier_pooling="cls" if pooling == "bos" else pooling,
        attention_dropout_rate=hf.get("attention_dropout", 0.0),
        initializer_range=hf.get("initializer_range", 0.02))
  else:
    raise errors.ConfigError(f"model_type {model_type!r} is not a modern encoder "
                             f"({', '.join(MODEL_TYPES)}).")
  ids = {k: hf[k] for k in TOKEN_IDS if isinstance(hf.get(k), int)}
  return cfg.replace(**ids, **overrides)


def config_to_hf(cfg: ModernConfig, architecture: str, num_labels: int = 0) -> dict[str, Any]:
  """ModernConfig -> the config.json transformers reads for `architecture`."""
  common = {"architectures": [architecture], "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_heads, "intermediate_size": cfg.intermediate_size,
            "max_position_embeddings": cfg.max_position_embeddings,
            "attention_bias": cfg.attention_bias, "mlp_bias": cfg.mlp_bias,
            "attention_dropout": cfg.attention_dropout_rate,
            "initializer_range": cfg.initializer_range,
            "tie_word_embeddings": cfg.tie_word_embeddings,
            **{k: getattr(cfg, k) for k in TOKEN_IDS if getattr(cfg, k) is not None}}
  if num_labels:
    common["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_labels)}
    common["label2id"] = {f"LABEL_{i}": i for i in range(num_labels)}
  if cfg.family == "modernbert":
    return {**common, "model_type": "modernbert", "hidden_activation": cfg.hidden_act,
            "norm_eps": cfg.norm_eps, "norm_bias": cfg.norm_bias,
            "layer_types": list(cfg.layer_types), "local_attention": cfg.local_window,
            "rope_parameters": {GLOBAL: {"rope_type": "default", "rope_theta": cfg.rope_theta},
                                LOCAL: {"rope_type": "default",
                                        "rope_theta": cfg.local_rope_theta}},
            "classifier_bias": cfg.head_bias, "classifier_activation": cfg.head_act,
            "decoder_bias": cfg.decoder_bias, "classifier_pooling": cfg.classifier_pooling,
            "embedding_dropout": cfg.embedding_dropout_rate, "mlp_dropout": cfg.mlp_dropout_rate,
            "classifier_dropout": cfg.classifier_dropout_rate,
            "initializer_cutoff_factor": cfg.initializer_cutoff_factor}
  return {**common, "model_type": "eurobert", "num_key_value_heads": cfg.kv_heads,
          "head_dim": cfg.head_dim, "hidden_act": cfg.hidden_act, "rms_norm_eps": cfg.norm_eps,
          "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
          "classifier_pooling": "bos" if cfg.classifier_pooling == "cls" else cfg.classifier_pooling}


# ----------------------------------------------------------------------------
# State dicts <-> params.

def _strip(state: Mapping[str, Array]) -> dict[str, Array]:
  return {k.removeprefix("model."): np.asarray(v) for k, v in state.items()}


def hf_to_params(state: Mapping[str, Array], cfg: ModernConfig, target: str = "pretraining",
                 source: str = "checkpoint") -> dict:
  """transformers state dict -> our tree (target "pretraining": masked-LM shaped, heads at
  the top; "encoder": the `bert` subtree alone; "all": a fine-tuned `classifier` too). The
  encoder must be complete; the prediction head, the masked-LM output and the classifier are
  each loaded when present (whole)."""
  origin = {k.removeprefix("model."): k for k in state}
  state = _strip(state)
  out = "decoder" if cfg.family == "modernbert" else "lm_head"
  emb = ("embeddings.tok_embeddings.weight" if cfg.family == "modernbert"
         else "embed_tokens.weight")
  if cfg.tie_word_embeddings and f"{out}.weight" in state:
    if not np.array_equal(state[f"{out}.weight"], state.get(emb)):
      raise formats.CheckpointMismatchError(
          f"{source}: {out}.weight differs from {emb} although config.json ties them "
          "(tie_word_embeddings): fix the config or the checkpoint.")
    del state[f"{out}.weight"]
  classes = state["classifier.weight"].shape[0] if "classifier.weight" in state else 0
  rules = _rules(cfg, classes if target == "all" else 0)
  present = {r.part: [] for r in rules}
  for r in rules:
    present[r.part].append(r.hf in state)
  loaded = {p: p == "encoder" or all(flags) for p, flags in present.items()}
  params: dict = {}
  missing, bad, used = [], [], set()
  for r in rules:
    if not loaded[r.part] and not any(present[r.part]):
      continue
    if r.hf not in state:
      missing.append(r.hf)
      continue
    used.add(r.hf)
    try:
      values = r.load(np.asarray(state[r.hf], np.float32))
    except ValueError:
      bad.append(f"{origin.get(r.hf, r.hf)}: {state[r.hf].shape}")
      continue
    for path, value in zip(r.paths, values):
      if target == "encoder" and path[0] != "bert":
        continue
      formats.set_path(params, path[1:] if target == "encoder" else path, value)
  model = formats.describe_model(cfg, target)
  left_out = formats.check_read(source, model, missing=missing, bad_shape=bad,
                                unused=[k for k in state if k not in used], heads=HEADS,
                                origin=origin, num_layers=cfg.num_layers)
  formats.warn_left_out(source, model, left_out, origin)
  if not cfg.first_attn_norm:  # the unread attention norm of layer 0 (see modern.Layer)
    layer0 = (params if target == "encoder" else params["bert"])["encoder"]["layer_0"]
    layer0["attn_norm"] = {"scale": np.ones(cfg.hidden_size, np.float32)}
    if cfg.norm_bias and cfg.norm == "layernorm":
      layer0["attn_norm"]["bias"] = np.zeros(cfg.hidden_size, np.float32)
  _check_shapes(params, cfg, target)
  return params


def _check_shapes(params: dict, cfg: ModernConfig, target: str) -> None:
  """Every leaf against the shape the model of `cfg` expects (a config.json whose sizes do
  not match the weights is named here, tensor by tensor)."""
  ids = jnp.zeros((1, 2), jnp.int32)
  init = lambda m, *a: flax.traverse_util.flatten_dict(jax.eval_shape(
      lambda: nn.unbox(m.init(jax.random.key(0), *a))["params"]))
  want = init(modern.ModernModel(cfg), ids, ids, ids)  # the encoder with its pooled head
  if target != "encoder":
    want = {**init(modern.ModernForMaskedLM(cfg), ids, ids, ids, ids),
            **{("bert",) + k: v for k, v in want.items()}}
  got = flax.traverse_util.flatten_dict(params)
  wrong = [f"{'/'.join(k)}: {tuple(v.shape)} vs {tuple(want[k].shape)}"
           for k, v in got.items() if k in want and tuple(v.shape) != tuple(want[k].shape)]
  if wrong:
    raise formats.CheckpointMismatchError(
        f"Tensors of the wrong shape for the {cfg.family} config:\n  " + "\n  ".join(wrong))


def params_to_hf(params: dict, cfg: ModernConfig) -> dict[str, Array]:
  """Our tree (any of the parts, unrolled) -> transformers' state dict of the model class
  that holds them (keys with the `model.` prefix where the class has one)."""
  params = formats.to_numpy(params)
  tree = params if "bert" in params else {"bert": params}
  classes = tree["classifier"]["kernel"].shape[-1] if "classifier" in tree else 0
  has = lambda path: _has(tree, path)
  state = {}
  for r in _rules(cfg, classes):
    if not all(has(p) for p in r.paths):
      continue
    state[r.hf] = np.ascontiguousarray(r.save(*[np.asarray(formats.get_path(tree, p), np.float32)
                                                for p in r.paths]))
  head_only = "bert" not in params or not (set(params) - {"bert"})
  prefix = "" if head_only else "model."
  out = {}
  for k, v in state.items():
    top = k.startswith(("head.", "decoder.", "lm_head.", "classifier.", "dense."))
    out[k if top else prefix + k] = v
  if cfg.tie_word_embeddings and not head_only and "decoder_bias" in tree:
    name = "decoder.weight" if cfg.family == "modernbert" else "lm_head.weight"
    emb = "embeddings.tok_embeddings.weight" if cfg.family == "modernbert" else "embed_tokens.weight"
    out[name] = out["model." + emb]
  return out


def _has(tree, path) -> bool:
  for key in path:
    if not isinstance(tree, dict) or key not in tree:
      return False
    tree = tree[key]
  return True


# ----------------------------------------------------------------------------
# Directories.

def read_hf(path: str, target: str = "pretraining", require_mlm: bool = True
            ) -> tuple[ModernConfig, dict]:
  """(config, unrolled params on the host) of a HuggingFace ModernBERT/EuroBERT directory
  (`require_mlm`: unused, an encoder-only directory reads as one)."""
  del require_mlm
  d = fileio.path(path)
  hf = json.loads((d / "config.json").read_text())
  missing = [k for k in HF_REQUIRED if not isinstance(hf.get(k), int)]
  if missing:
    raise formats.CorruptCheckpointFileError(
        f"{d / 'config.json'} lacks {', '.join(missing)} (or not as an integer): fix the file.")
  cfg = config_from_hf(hf)
  state = formats.read_hf_state(path)
  return cfg, hf_to_params(state, cfg, target, source=f"HuggingFace checkpoint {path}")


def export_hf(path: str, cfg: ModernConfig, params: dict, tokenizer: Any = None,
              task_head: str = "sequence") -> None:
  """model.safetensors + config.json that transformers loads with no missing or unexpected
  keys (config.json last: a directory without it is not read as a checkpoint); with the
  `tokenizer`, config.json names the special ids the model was trained with; a fine-tuned
  classifier as the class of its kind `task_head` (TASK_HEADS[family] lists them)."""
  if tokenizer is not None:
    ids = dict(pad_token_id=tokenizer.pad_id, cls_token_id=tokenizer.cls_id,
               sep_token_id=tokenizer.sep_id, bos_token_id=tokenizer.cls_id,
               eos_token_id=tokenizer.sep_id, mask_token_id=tokenizer.mask_id)
    cfg = cfg.replace(**{k: v for k, v in ids.items() if getattr(cfg, k) is None})
  state = params_to_hf(params, cfg)
  mlm = "decoder_bias" in params or "lm_head" in params
  architecture = ARCHITECTURES[(cfg.family, "mlm" if mlm else "encoder")]
  num_labels = 0
  if "classifier" in params:  # the class of its kind; the head's output as transformers' names
    num_labels = params["classifier"]["kernel"].shape[-1]
    architecture = (ARCHITECTURES[(cfg.family, "encoder")].removesuffix("Model")
                    + formats.TASK_HEAD_CLASSES[task_head])
    if task_head in ("token", "span") and not cfg.head_tokens:  # (EuroBERT: no head there)
      state = {k: v for k, v in state.items() if not k.startswith(("head.", "dense."))}
  elif not mlm:  # the bare model has no head (an encoder read from a masked-LM checkpoint)
    state = {k: v for k, v in state.items() if not k.startswith(("head.", "dense."))}
  d = fileio.path(path)
  d.mkdir(parents=True, exist_ok=True)
  if cfg.tie_word_embeddings:  # safetensors stores a tied tensor once, as transformers does
    state.pop("decoder.weight" if cfg.family == "modernbert" else "lm_head.weight", None)
  formats.write_safetensors(d / "model.safetensors", state, metadata={"format": "pt"})
  (d / "config.json").write_text(json.dumps(config_to_hf(cfg, architecture, num_labels), indent=2))


# What the jobs need of the modern families (bert_jax/families.py). max_position_embeddings
# may differ between a checkpoint and config.model (a context-extension phase raises it).
ARCHITECTURE_FIELDS = ("family", "vocab_size", "hidden_size", "num_layers", "num_heads",
                       "num_kv_heads", "intermediate_size", "hidden_act", "norm",
                       "norm_eps", "norm_bias", "attention_bias", "mlp_bias",
                       "embedding_norm", "first_attn_norm", "global_every",
                       "local_window", "head_norm", "head_bias", "head_act",
                       "head_tokens", "tie_word_embeddings", "decoder_bias")
DROPOUT = ("embedding_dropout_rate", "attention_dropout_rate", "mlp_dropout_rate",
           "classifier_dropout_rate")  # fine-tuning's default: the checkpoint's config.json


def forward_flops(cfg: ModernConfig, seq_len: int, num_predictions: int, nsp: bool = False,
                  last_rows: int | None = None) -> int:
  """Matmul FLOPs of one forward pass of a modern encoder (models/modern.py) over one
  sequence: grouped q/k/v, gated MLP (three matmuls), local layers over their band, the
  prediction head and vocabulary projection at the P gathered positions."""
  del nsp, last_rows  # (no NSP head; every layer computes every row)
  L, D, F, V, P = (seq_len, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size,
                   num_predictions)
  qkv = 2 * L * D * (cfg.num_heads + 2 * cfg.kv_heads) * cfg.head_dim
  per_layer = qkv + 2 * L * cfg.num_heads * cfg.head_dim * D + 2 * L * D * F * 3
  head = 2 * P * D * D if cfg.head_tokens else 0
  return (cfg.num_layers * per_layer + modern_attention.attention_flops(cfg, L) + head
          + 2 * P * D * V)


def _family(name: str) -> families.Family:
  return families.Family(
      name=name, config=ModernConfig,
      from_fields=lambda fields, vocab_size: modern.config_from_fields(fields, vocab_size,
                                                                       family=name),
      encoder=modern.ModernModel,
      masked_lm=lambda cfg, nsp: modern.ModernForMaskedLM(cfg, nsp=nsp),
      read_hf=read_hf, config_from_hf=config_from_hf, read_native=formats.read_native_tree,
      export_hf=export_hf,
      model_types=(name,),
      architecture_fields=ARCHITECTURE_FIELDS, dropout={k: None for k in DROPOUT},
      forward_flops=forward_flops, padded_vocab=True,
      vocab_tensors=(("tok_embeddings/embedding", 0), ("decoder_bias", 0),
                     ("lm_head/kernel", 1), ("lm_head/bias", 0)),
      names_specials=True, vocab_kind="bpe", task_heads=TASK_HEADS[name],
      mlm_head={"modernbert": ("a ModernBertForMaskedLM", "head.*, decoder.*"),
                "eurobert": ("a EuroBertForMaskedLM", "lm_head.*")}[name])


FAMILIES = {name: _family(name) for name in MODEL_TYPES}
