"""Sentence embeddings: an encoder's last layer pooled (mean / cls / last token) and
optionally L2-normalised, computed over any number of texts in batches, and the
sentence-transformers directory layout (modules.json, the pooling module's config) read and
written, so that a sentence-transformers model is an initial checkpoint and an export of ours
is one `SentenceTransformer(dir)` loads.

    spec = embed.read_spec(path) or embed.Spec()         # a sentence-transformers dir's own
    cfg, params = loader.read(embed.transformer_dir(path), "encoder")
    for vectors in embed.iter_embeddings(cfg, params, tokenizer, texts, spec): ...
    convert.export_sentence_transformers(out, cfg, params, tokenizer, spec)  # the other way
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import json
from typing import Any, Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import best_dir
from bert_jax import families
from common import errors
from common import fileio
from input_pipeline import features

POOLINGS = ("mean", "cls", "last")
# sentence-transformers' Pooling config: the key that turns each of our modes on.
_ST_POOLING = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token",
               "last": "pooling_mode_lasttoken"}
_ST_PREFIX = "sentence_transformers.models."
# The encoder module's kinds: Transformer, and the per-architecture modules that
# sentence-transformers before v1 wrote instead (the encoder in 0_BERT/, ...).
_ST_ENCODERS = ("Transformer", "BERT", "RoBERTa", "XLMRoBERTa", "CamemBERT", "DistilBERT",
                "ALBERT", "XLNet", "T5")
MODULES_FILE = "modules.json"
SIMILARITIES = ("cosine", "dot")


class EmbedError(errors.UserError, ValueError):
  """A sentence-transformers directory or an embedding setting bert_jax cannot use."""


@dataclasses.dataclass(frozen=True)
class Spec:
  """How token vectors become one vector a text."""
  pooling: str = "mean"  # mean over the real tokens ([CLS], [SEP] included), cls, last
  normalize: bool = False  # L2-normalise (then cosine similarity is a dot product)
  max_seq_length: int | None = None  # tokens a text, [CLS] and [SEP] included (None: the model's)
  similarity: str = "cosine"
  # Matryoshka: keep the vectors' first components only (normalised after the cut when
  # `normalize`), as sentence-transformers' truncate_dim with normalize_embeddings. None: all.
  truncate_dim: int | None = None

  def __post_init__(self):
    if self.truncate_dim is not None and self.truncate_dim < 1:
      raise EmbedError(f"truncate_dim {self.truncate_dim}: keep 1 component at least (or none "
                       "to keep them all).")
    if self.pooling not in POOLINGS:
      raise EmbedError(f"pooling {self.pooling!r} is unknown: choose one of {', '.join(POOLINGS)}.")
    if self.similarity not in SIMILARITIES:
      raise EmbedError(f"similarity {self.similarity!r} is unknown: choose one of "
                       f"{', '.join(SIMILARITIES)}.")


def pool(hidden_BLD: jax.Array, mask_BL: jax.Array, mode: str) -> jax.Array:
  """[B, D] in float32: the mean of the real tokens' vectors, the first token's, or the last
  real token's (rows padded at the end)."""
  hidden_BLD = hidden_BLD.astype(jnp.float32)
  if mode == "cls":
    return hidden_BLD[:, 0]
  if mode == "last":
    last_B = jnp.maximum(mask_BL.sum(axis=1) - 1, 0)
    return jnp.take_along_axis(hidden_BLD, last_B[:, None, None], axis=1)[:, 0]
  mask = mask_BL.astype(jnp.float32)[..., None]
  return (hidden_BLD * mask).sum(axis=1) / jnp.maximum(mask.sum(axis=1), 1e-9)


def pool_packed(hidden_RLD: jax.Array, packed_example_ids_RL: jax.Array,
                position_ids_RL: jax.Array, texts_per_row: int, mode: str) -> jax.Array:
  """[R, E, D] in float32: `pool` of each text of packed rows (packed_example_ids: its slot
  + 1, 0 = padding; position_ids restarting at each text), E = texts_per_row slots a row
  (an empty slot's vector is 0)."""
  in_slot_RLE = packed_example_ids_RL[..., None] == jnp.arange(1, texts_per_row + 1)
  count_RE = in_slot_RLE.sum(1)
  if mode == "cls":
    weight_RLE = in_slot_RLE & (position_ids_RL == 0)[..., None]
  elif mode == "last":
    weight_RLE = in_slot_RLE & (position_ids_RL[..., None] == count_RE[:, None] - 1)
  else:
    weight_RLE = in_slot_RLE / jnp.maximum(count_RE[:, None], 1).astype(jnp.float32)
  return jnp.einsum("rle,rld->red", weight_RLE.astype(jnp.float32),
                    hidden_RLD.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)


def l2_normalize(x: jax.Array) -> jax.Array:
  """x / max(||x||, 1e-12) along the last axis (torch.nn.functional.normalize's)."""
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def embeddings(hidden_BLD: jax.Array, mask_BL: jax.Array, spec: Spec) -> jax.Array:
  """The pooled (per `spec`, truncated and normalised) vectors of a batch's last layer."""
  pooled = pool(hidden_BLD, mask_BL, spec.pooling)[:, :spec.truncate_dim]
  return l2_normalize(pooled) if spec.normalize else pooled


# ---- sentence-transformers directories -------------------------------------------------------

def _read_json(path, what: str) -> Any:
  try:
    return json.loads(fileio.path(path).read_text())
  except FileNotFoundError:
    raise EmbedError(f"{path}: missing; {what}.") from None
  except ValueError as e:
    raise EmbedError(f"{path} is not valid JSON ({e}); {what}.") from None


def _modules(path: str) -> list[dict] | None:
  """modules.json of a sentence-transformers directory, None where there is none."""
  file = fileio.path(path) / MODULES_FILE
  if not file.exists():
    return None
  modules = _read_json(file, "a sentence-transformers directory lists its modules there")
  if not isinstance(modules, list) or not all(isinstance(m, dict) and "type" in m for m in modules):
    raise EmbedError(f"{file}: expected a list of {{\"type\", \"path\"}} objects, as "
                     "sentence-transformers writes it.")
  return modules


def transformer_dir(path: str) -> str:
  """Where the encoder of `path` lies: its Transformer module's folder in a
  sentence-transformers directory (usually the directory itself), a fine-tuning workdir's
  best/, else `path`."""
  path = best_dir.of_run(path)
  for m in _modules(path) or ():
    if m["type"].rsplit(".", 1)[-1] in _ST_ENCODERS and m.get("path"):
      return str(fileio.path(path) / m["path"])
  return path


def read_spec(path: str) -> Spec | None:
  """The pooling, normalisation, length and similarity of a sentence-transformers directory
  (None: `path` is not one). A module bert_jax does not compute (Dense, a pooling mode other
  than mean / cls / last token) is an EmbedError naming it."""
  path = best_dir.of_run(path)
  modules = _modules(path)
  if modules is None:
    return _finetuned_spec(path)
  root = fileio.path(path)
  pooling, normalize = None, False
  for m in modules:
    kind = m["type"].removeprefix(_ST_PREFIX)
    if kind in _ST_ENCODERS:
      continue
    if kind == "Normalize":
      normalize = True
    elif kind == "Pooling":
      config = _read_json(root / m.get("path", "") / "config.json",
                          "the Pooling module's settings are read from it")
      modes = [mode for mode, key in _ST_POOLING.items() if config.get(key)]
      other = [k for k, v in config.items() if k.startswith("pooling_mode") and v
               and k not in _ST_POOLING.values()]
      if other or len(modes) != 1:
        raise EmbedError(f"{root / m.get('path', '')}/config.json: pooling "
                         f"{', '.join(other + modes) or 'none'}: bert_jax pools by exactly one of "
                         f"{', '.join(_ST_POOLING.values())}.")
      pooling = modes[0]
    else:
      raise EmbedError(f"{root / MODULES_FILE}: module {m['type']} is not one bert_jax computes "
                       "(it reads Transformer, Pooling and Normalize).")
  if pooling is None:
    raise EmbedError(f"{root / MODULES_FILE}: no Pooling module: bert_jax needs one to know "
                     "how token vectors become a text's vector.")
  length = None
  for folder in (root, fileio.path(transformer_dir(path))):  # (the old layout: its module's)
    if length is None and (folder / "sentence_bert_config.json").exists():
      length = _read_json(folder / "sentence_bert_config.json", "").get("max_seq_length")
  settings = {}
  if (root / "config_sentence_transformers.json").exists():
    settings = _read_json(root / "config_sentence_transformers.json", "")
  similarity = {"cosine": "cosine", "dot": "dot", None: "cosine"}.get(
      settings.get("similarity_fn_name"))
  if similarity is None:
    raise EmbedError(f"{root}/config_sentence_transformers.json: similarity_fn_name "
                     f"{settings.get('similarity_fn_name')!r}: bert_jax scores by cosine or dot.")
  return Spec(pooling, normalize, length, similarity)


def _finetuned_spec(path: str) -> Spec | None:
  """The Spec a contrastive fine-tuning run (config.task=embed) recorded in its best/."""
  task = best_dir.recorded_task(path)
  if task is None or task.get("task") != "embed":
    return None
  return Spec(task.get("pooling", "mean"), bool(task.get("normalize", False)),
              task.get("max_seq_length"), task.get("similarity", "cosine"))


def write_spec(path: str, spec: Spec, dim: int, max_seq_length: int) -> None:
  """modules.json (Transformer at the directory itself, Pooling, Normalize), the pooling
  module's config, sentence_bert_config.json and config_sentence_transformers.json (the
  similarity function): what SentenceTransformer(path) reads beside the model."""
  root = fileio.path(path)
  modules = [{"idx": 0, "name": "0", "path": "", "type": _ST_PREFIX + "Transformer"},
             {"idx": 1, "name": "1", "path": "1_Pooling", "type": _ST_PREFIX + "Pooling"}]
  if spec.normalize:
    modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": _ST_PREFIX + "Normalize"})
  pooling = {"word_embedding_dimension": dim, "pooling_mode_cls_token": False,
             "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
             "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
             "pooling_mode_lasttoken": False, _ST_POOLING[spec.pooling]: True}
  (root / "1_Pooling").mkdir(parents=True, exist_ok=True)
  (root / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
  (root / "sentence_bert_config.json").write_text(json.dumps(
      {"max_seq_length": max_seq_length, "do_lower_case": False}, indent=2))
  (root / "config_sentence_transformers.json").write_text(json.dumps(
      {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": spec.similarity},
      indent=2))
  (root / MODULES_FILE).write_text(json.dumps(modules, indent=2))  # last: marks it complete


# ---- embedding many texts -------------------------------------------------------------------

def encoder_params(params: Any) -> tuple[Any, bool]:
  """(the encoder's parameters, whether they hold a pooler) of a checkpoint's tree."""
  encoder = params["bert"] if "bert" in params else params
  return encoder, bool({"pooler", "head"} & set(encoder))


@functools.lru_cache(maxsize=8)
def _embed_fn(cfg: Any, has_pooler: bool, spec: Spec):
  module = families.of(cfg).encoder(cfg, add_pooler=has_pooler)

  @jax.jit
  def run(params, ids_BL, mask_BL):
    hidden_BLD = module.apply({"params": params}, ids_BL, jnp.zeros_like(ids_BL), mask_BL)[0]
    return embeddings(hidden_BLD, mask_BL, spec)
  return run


def _length_bucket(n: int, high: int) -> int:
  """n rounded up to a power of two, at least 16, at most `high`: few shapes to compile."""
  return min(high, max(16, 1 << max(n - 1, 0).bit_length()))


def encode(tokenizer, texts: list[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
  """ids and mask [len(texts), bucketed length] of [CLS] text [SEP], cut to `max_len`."""
  rows = [features.encode_pair(tokenizer, list(r)[:max_len - 2])[0]
          for r in tokenizer.encode_batch(texts)]
  length = _length_bucket(max(map(len, rows)), max_len)
  ids = np.zeros((len(rows), length), np.int32)
  mask = np.zeros_like(ids)
  for i, r in enumerate(rows):
    ids[i, :len(r)], mask[i, :len(r)] = r, 1
  return ids, mask


def iter_embeddings(cfg: Any, params: Any, tokenizer, texts: Iterable[str], spec: Spec,
                    batch_size: int = 32) -> Iterator[np.ndarray]:
  """[b, D] float32 vectors per batch of `batch_size` texts, read as they come (memory flat in
  their number); each batch padded to `batch_size` rows so that few shapes compile."""
  if (spec.truncate_dim or 0) > cfg.hidden_size:
    raise EmbedError(f"truncate_dim {spec.truncate_dim} is more than the model's "
                     f"{cfg.hidden_size} dimensions: give at most {cfg.hidden_size}.")
  encoder, has_pooler = encoder_params(params)
  fn = _embed_fn(cfg, has_pooler, spec)
  max_len = min(spec.max_seq_length or cfg.max_length, cfg.max_length)
  texts = iter(texts)
  while batch := list(itertools.islice(texts, batch_size)):
    ids, mask = encode(tokenizer, batch + [""] * (batch_size - len(batch)), max_len)
    yield np.asarray(fn(encoder, ids, mask))[:len(batch)]


def embed_texts(cfg: Any, params: Any, tokenizer, texts: Iterable[str], spec: Spec,
                batch_size: int = 32) -> np.ndarray:
  """[N, D]: every text's vector (iter_embeddings, gathered)."""
  out = list(iter_embeddings(cfg, params, tokenizer, texts, spec, batch_size))
  return np.concatenate(out) if out else np.zeros((0, dim(cfg, spec)), np.float32)


def dim(cfg: Any, spec: Spec) -> int:
  """The length of the model's vectors under `spec`."""
  return min(spec.truncate_dim or cfg.hidden_size, cfg.hidden_size)
