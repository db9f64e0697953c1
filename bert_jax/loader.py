"""The one way weights enter a model.

    params = loader.load_into(path, abstract_params, fresh_params)   # onto the target shardings
    cfg, params = loader.read(path, target="encoder")                 # on the host

`path` is a run of ours (a workdir, its `checkpoints/` dir or one step dir), a bert_jax
export, a HuggingFace directory or a Google TF checkpoint. Our runs are read with Orbax,
straight onto the target's shardings (`load_into`) or onto the host (`read`); the other
formats through their family's name tables (bert_jax/models/), on the host. Pre-training's
init_checkpoint, fine-tuning, predict and the convert CLI all read through here, and the
Checkpointer's resume uses the same layout, finiteness and tree helpers. This module owns:

  - the layout: the encoder's layers unrolled (`encoder/layer_i`) or scanned
    (`encoder/layers`, one stacked array per weight), converted to the target's;
  - the fit check: the encoder must fit the model exactly; parts the model has and the
    checkpoint lacks start fresh (logged), parts the model does not use are left out
    (one warning);
  - the finite check: weights holding NaN or Inf are never loaded;
  - the fallback past damaged steps of our runs: the newest step whose files match their
    checksums (MANIFEST.json) and whose weights are finite is read, and the log names the
    damaged ones; nothing is moved (this is a reader; the Checkpointer's resume moves a
    damaged step of its own workdir aside).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Iterable

from absl import logging
from etils import epath
import flax
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from bert_jax import best_dir
from bert_jax import families
from bert_jax import formats
from bert_jax.models import bert as model_lib
from bert_jax.models import bert_formats
from bert_jax.models.bert import BertConfig
from bert_jax.models.layers import ModelConfig
from common import fileio
from input_pipeline import data_config
from input_pipeline import tokenizer as tokenizer_lib

Keys = tuple[str, ...]
MODEL_CONFIG_KEY = "bert_model"  # the model's BertConfig, in each checkpoint's config item


# ----------------------------------------------------------------------------
# Trees: flat keys, layouts, finiteness.

def flat(tree: Any) -> dict[Keys, Any]:
  """Key path (a tuple of names) -> leaf."""
  return {tuple(str(getattr(k, "key", k)) for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def unflat(leaves: dict[Keys, Any]) -> dict:
  return flax.traverse_util.unflatten_dict(leaves)


def is_scanned(keys: Iterable[Keys]) -> bool:
  """Whether the key paths hold a scanned encoder (`encoder/layers`: families' layout)."""
  scanned = (families.ENCODER, families.SCANNED_LAYERS)
  return any(k[i:i + 2] == scanned for k in keys for i in range(len(k) - 1))


def _encoder_holder(node: Any) -> bool:
  return isinstance(node, dict) and isinstance(node.get(families.ENCODER), dict)


def relayout(tree: Any, scanned: bool, stack: Callable = np.stack,
             unstack: Callable = lambda x, i: np.asarray(x[i])) -> Any:
  """`tree` (params, a TrainState, optimizer moments ...) with every encoder in the scanned
  or unrolled layout; `stack(list of per-layer leaves)` and `unstack(leaf, i)` do the arrays
  (numpy by default; jnp or ShapeDtypeStructs too)."""
  def fix(node):
    layer, layers = families.UNROLLED_LAYER, families.SCANNED_LAYERS
    if not _encoder_holder(node) or (layers in node[families.ENCODER]) == scanned:
      return node
    enc = node[families.ENCODER]
    if scanned:
      n = sum(layer.format(i) in enc for i in range(len(enc)))
      new = {layers: jax.tree.map(lambda *xs: stack(list(xs)),
                                  *[enc[layer.format(i)] for i in range(n)])}
    else:
      n = jax.tree.leaves(enc[layers])[0].shape[0]
      new = {layer.format(i): jax.tree.map(lambda x, i=i: unstack(x, i), enc[layers])
             for i in range(n)}
    return {**node, families.ENCODER: new}
  return jax.tree.map(fix, tree, is_leaf=_encoder_holder)


def to_layout(params: Any, scanned: bool) -> Any:
  """Host params in the scanned (`encoder/layers`) or unrolled (`encoder/layer_i`) layout."""
  return relayout(params, scanned)


def _spec_sharding(a: jax.ShapeDtypeStruct, spec: tuple) -> Any:
  if isinstance(a.sharding, NamedSharding):
    return NamedSharding(a.sharding.mesh, PartitionSpec(*spec))
  return a.sharding  # single device / replicated


def _abstract_stack(xs: list) -> jax.ShapeDtypeStruct:
  a = xs[0]
  spec = tuple(a.sharding.spec) if isinstance(a.sharding, NamedSharding) else ()
  return jax.ShapeDtypeStruct((len(xs),) + a.shape, a.dtype,
                              sharding=_spec_sharding(a, (None,) + spec))


def _abstract_unstack(a: jax.ShapeDtypeStruct, i: int) -> jax.ShapeDtypeStruct:
  del i
  spec = tuple(a.sharding.spec) if isinstance(a.sharding, NamedSharding) else ()
  return jax.ShapeDtypeStruct(a.shape[1:], a.dtype, sharding=_spec_sharding(a, spec[1:]))


def abstract_layout(abstract: Any, scanned: bool) -> Any:
  """ShapeDtypeStructs (with shardings) of `abstract` in the other layout: a restore target
  for a checkpoint saved that way."""
  return relayout(abstract, scanned, _abstract_stack, _abstract_unstack)


def onto_layout_of(tree: Any, abstract: Any) -> Any:
  """Device arrays `tree` converted on device to the layout and shardings of `abstract`."""
  scanned = is_scanned(flat(abstract))
  logging.info("Converting the checkpoint's layers to the configured layout "
               "(model.scan_layers=%s).", scanned)
  shardings = jax.tree.map(lambda a: a.sharding, abstract)
  return jax.jit(lambda t: relayout(t, scanned, jnp.stack, lambda x, i: x[i]),
                 out_shardings=shardings)(tree)


def nonfinite(tree: Any) -> list[str]:
  """The key paths (a/b/c) of the float leaves of `tree` that hold NaN or Inf: host arrays
  with numpy, device arrays in one jitted pass."""
  items = [(k, x) for k, x in flat(tree).items() if jnp.issubdtype(x.dtype, jnp.floating)]
  if not items:
    return []
  if all(isinstance(x, np.ndarray) for _, x in items):
    ok = [bool(np.isfinite(x).all()) for _, x in items]
  else:
    ok = jax.device_get(jax.jit(lambda xs: jnp.stack([jnp.all(jnp.isfinite(x)) for x in xs]))(
        [x for _, x in items]))
  return ["/".join(k) for (k, _), good in zip(items, ok) if not good]


# ----------------------------------------------------------------------------
# Runs of ours: `workdir/checkpoints/<step>/{state, data, config}` (bert_jax/checkpointing.py).

def is_run(path: str) -> bool:
  """Whether `path` is one of our workdirs / checkpoint dirs (vs. an export, HF or TF)."""
  p = fileio.path(path)
  if not p.exists():
    return False
  for c in (p / "checkpoints", p, p.parent):
    if c.is_dir() and any(x.name.isdigit() and (x / "state").exists() for x in c.iterdir()):
      return True
  return (p / "state").is_dir()


def step_dirs(path) -> list[epath.Path]:
  """A workdir or its `checkpoints/` dir -> its saved step dirs, newest first ([] where
  none); one `<step>` dir -> itself."""
  path = fileio.path(path)
  if (path / "checkpoints").is_dir():
    path = path / "checkpoints"
  if (path / "state").is_dir():
    return [path]
  if not path.is_dir():
    return []
  steps = sorted((int(p.name) for p in path.iterdir() if p.name.isdigit()), reverse=True)
  return [path / str(step) for step in steps]


def _step_dirs(path: str) -> list[epath.Path]:
  """step_dirs, of which there must be one."""
  found = step_dirs(path)
  if not found:
    where = fileio.path(path)
    where = where / "checkpoints" if (where / "checkpoints").is_dir() else where
    raise formats.CheckpointNotFoundError(f"No checkpoint found in {where}.")
  return found


def saved_param_shapes(step_dir: str | os.PathLike) -> dict[Keys, tuple[int, ...]]:
  """Key path -> shape of every parameter a step dir (or the newest step of a run) holds,
  from its metadata (no array is read)."""
  # The item handler's own metadata: the step-level file is not needed (nor warned about).
  handler = ocp.PyTreeCheckpointHandler()
  try:
    tree = handler.metadata(_step_dirs(os.fspath(step_dir))[0] / "state").tree["params"]
  finally:
    handler.close()
  return {k: tuple(m.shape) for k, m in flat(tree).items()}


def _restore_params(step_dir: epath.Path, abstract_params: Any) -> Any:
  """The params of one step dir of ours, onto the shardings of `abstract_params` (which may
  name a subset of them).

  Reads the `state` item with its own handler: a read-only CheckpointManager or a
  Checkpointer on the item would log warnings that read like damage
  (`Metadata file does not exist: .../_CHECKPOINT_METADATA`, `read_only=True, ...`)."""
  restore_args = ocp.checkpoint_utils.construct_restore_args(abstract_params)
  handler = ocp.PyTreeCheckpointHandler()
  try:
    restored = handler.restore(step_dir / "state", args=ocp.args.PyTreeRestore(
        item={"params": abstract_params}, restore_args={"params": restore_args},
        partial_restore=True))
  finally:
    handler.close()
  return restored["params"]


def _read_step_params(step_dir: epath.Path) -> Any:
  """The params (numpy, on the host) of one step dir of ours, as saved."""
  handler = ocp.PyTreeCheckpointHandler()  # the item's own metadata: no step-level file read
  try:
    meta = handler.metadata(step_dir / "state").tree["params"]
  finally:
    handler.close()
  cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
  abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=cpu), meta)
  return jax.tree.map(np.asarray, _restore_params(step_dir, abstract))


def config_from_params(params: Any, base: ModelConfig) -> ModelConfig:
  """`base` with every field that shapes the parameters read from `params` (any heads,
  scanned or not): vocabulary, hidden size, layers, heads, intermediate size, positions,
  token types. For checkpoints that do not record their BertConfig."""
  shapes = {k: np.shape(x) for k, x in flat(params).items()}
  emb = {k[-2]: s for k, s in shapes.items() if "embeddings" in k and k[-1] == "embedding"}
  query = {k: s for k, s in shapes.items() if k[-3:] == ("attention", "query", "bias")}
  inter = next(s for k, s in shapes.items() if k[-2:] == ("intermediate", "bias"))
  if any("layers" in k for k in query):  # scanned: [layers, heads, head_dim]
    (layers, heads, _), = query.values()
  else:
    layers, (heads, _) = len(query), next(iter(query.values()))
  return base.replace(vocab_size=emb["word_embeddings"][0], hidden_size=emb["word_embeddings"][1],
                      max_position_embeddings=emb["position_embeddings"][0],
                      type_vocab_size=emb["token_type_embeddings"][0], num_layers=layers,
                      num_heads=heads, intermediate_size=inter[-1])


def recorded_model_config(step_dir: epath.Path) -> Any | None:
  """The model config a step of ours recorded; None where it recorded none (older versions)
  or its record does not read."""
  recorded = _json_or_empty(step_dir / "config" / "metadata").get(MODEL_CONFIG_KEY)
  return formats.config_from_dict(recorded) if isinstance(recorded, dict) else None


def _saved_model_config(step_dir: epath.Path, params: Any) -> ModelConfig:
  """The BertConfig a step of ours recorded; older checkpoints: the sizes from the
  parameters, the rest from the run's config."""
  recorded = recorded_model_config(step_dir)
  if recorded is not None:
    return recorded
  saved = ml_collections.ConfigDict(json.loads((step_dir / "config" / "metadata").read_text()))
  fields = {k: v for k, v in (saved.get("model") or {}).items()
            if k in {f.name for f in dataclasses.fields(BertConfig)} | {"preset"}}
  params = to_layout(params, False)
  vocab_size = params["bert"]["embeddings"]["word_embeddings"]["embedding"].shape[0]
  base = model_lib.config_from_fields({**fields, "vocab_size": vocab_size}, vocab_size)
  return config_from_params(params, base)


def newest_intact(candidates: Iterable[Any], read: Callable[[Any], Any],
                  nonfinite_of: Callable[[Any], list[str]], damaged: Callable[[Any, str, Any], None],
                  *, verify: Callable[[Any], list[str] | None] = fileio.verify_manifest,
                  not_damage: tuple[type[Exception], ...] = (),
                  intact_error: Callable[[Any, Exception], Exception] | None = None
                  ) -> tuple[Any, Any, bool] | None:
  """The one policy for a run's saved steps (the loader's and the Checkpointer's): the
  newest of `candidates` (step dirs, newest first) that is intact, as (step dir, `read(step dir)`,
  whether its checksums verified it); None when none is.

  Intact: its files match the checksums written when it was saved (`verify`: the problems,
  [] when they match, None for a step saved without them), `read` succeeds, and
  `nonfinite_of(value)` names no NaN/Inf tensor. Each damaged step is told to `damaged(step
  dir, kind, detail)` and passed over: kind "checksums" (detail: the problems), "unreadable"
  (the exception; only for a step without checksums) or "nonfinite" (the tensors). A read
  that fails on files the checksums verified, or with one of `not_damage`, is no damage:
  it is raised (the former as `intact_error(step dir, exception)` makes it, if given)."""
  for step_dir in candidates:
    problems = verify(step_dir)
    if problems:
      damaged(step_dir, "checksums", problems)
      continue
    try:
      value = read(step_dir)
    except not_damage:
      raise
    except Exception as e:  # pylint: disable=broad-except
      if problems is not None:  # the checksums say the files are intact: not damage
        if intact_error is not None:
          raise intact_error(step_dir, e) from e
        raise
      damaged(step_dir, "unreadable", e)
      continue
    bad = nonfinite_of(value)
    if bad:
      damaged(step_dir, "nonfinite", bad)
      continue
    return step_dir, value, problems is not None
  return None


def _newest_intact(path: str, read: Callable[[epath.Path], Any]) -> tuple[epath.Path, Any]:
  """(step dir, `read(step dir)`) of the newest intact step of a run of ours (newest_intact;
  its weights finite). Damaged steps are passed over, named in the log; none intact (or the
  one step named damaged) is a CorruptCheckpointFileError naming the damage."""
  damaged = []
  why = {"checksums": lambda problems: problems,
         "unreadable": lambda e: [f"cannot be read: {type(e).__name__}: "
                                  f"{str(e).splitlines()[0][:300]}"],
         "nonfinite": lambda names: [f"{k}: NaN or infinite values" for k in names]}
  found = newest_intact(_step_dirs(path), read, nonfinite,
                        lambda step_dir, kind, detail: damaged.append((step_dir, why[kind](detail))),
                        not_damage=(formats.CheckpointMismatchError,))
  if found is not None:
    step_dir, params, _ = found
    for bad, problems in damaged:
      logging.warning("%s is damaged (%s): reading step %s instead.", bad, "; ".join(problems),
                      step_dir.name)
    return step_dir, params
  raise formats.CorruptCheckpointFileError(
      " ".join(f"{bad} is damaged ({'; '.join(why[:4])})." for bad, why in damaged)
      + " No intact checkpoint is left to read: copy the run again, or use another checkpoint.")


# ----------------------------------------------------------------------------
# Reading on the host.

def checkpoint_exists(path: str) -> bool:
  """Whether `path` exists as a checkpoint path: a directory or file, or the prefix of a
  Google TF checkpoint (`bert_model.ckpt`, whose `.index` file exists)."""
  return fileio.path(path).exists() or fileio.path(path + ".index").exists()


def read(path: str, target: str = "pretraining", *, require_mlm: bool = True
         ) -> tuple[ModelConfig, Any]:
  """(model config, unrolled params on the host) of any checkpoint. `target` (as convert's
  --target): "pretraining"
  (the encoder under `bert`, with the heads the checkpoint has: a run's tree as saved;
  another format's masked-LM head is required unless not `require_mlm`), "encoder" (the
  encoder and pooler alone) or "all" (as saved, a fine-tuned head included: a run or an
  export such as a fine-tuning run's best/). A path that does not exist is a
  CheckpointNotFoundError, a truncated or corrupt file or NaN/Inf weights a
  CorruptCheckpointFileError naming them (both UserErrors)."""
  if not checkpoint_exists(path):
    raise formats.CheckpointNotFoundError(
        f"{path} does not exist: the checkpoint must be a workdir of ours, a bert_jax export, "
        "a HuggingFace model directory or a Google TF checkpoint (bert_model.ckpt).")
  if is_run(path):
    step_dir, params = _newest_intact(path, _read_step_params)
    cfg = _saved_model_config(step_dir, params).replace(scan_layers=False)
    params = to_layout(params, False)
    return cfg, params["bert"] if target == "encoder" else params
  if target == "all" and (fileio.path(path) / "params").is_dir():  # best/ of older versions
    with ocp.StandardCheckpointer() as ckptr:
      params = jax.tree.map(np.asarray, ckptr.restore(fileio.path(path) / "params"))
    cfg = formats.config_from_dict(best_dir.recorded(path)["bert"])
  else:
    cfg, params = read_foreign(path, target, require_mlm=require_mlm)
  bad = nonfinite(params)
  if bad:
    raise formats.CorruptCheckpointFileError(
        f"{path} holds NaN or infinite weights in {len(bad)} tensors ({', '.join(bad[:5])}"
        f"{', ...' if len(bad) > 5 else ''}): the model would predict NaN. Use an intact copy "
        "(or an earlier checkpoint of the run that wrote it).")
  return cfg.replace(scan_layers=False), to_layout(params, False)


def read_foreign(path: str, target: str = "pretraining", *, require_mlm: bool = True
                 ) -> tuple[Any, formats.Params]:
  """(config, unrolled params on the host) of a bert_jax export, a HuggingFace directory (of
  the family its model_type names) or a Google TF checkpoint. The params hold the heads the
  checkpoint has (`formats.heads(params)` says which): target "pretraining" reads
  ...ForPreTraining and ...ForMaskedLM checkpoints (and, with require_mlm=False, encoder-only
  ones), "encoder" the encoder (+ pooler) of any; "all" an export's tree as saved (a
  fine-tuned head included)."""
  d = fileio.path(path)
  if (d / formats.NATIVE_CONFIG).exists():
    cfg = formats.native_config(path)
    return families.of(cfg).read_native(path, target, require_mlm)
  family = families.of_hf_dir(path)
  if family is not None:
    return family.read_hf(path, target, require_mlm)
  tf = bert_formats.read_tf(path, target, require_mlm)
  if tf is not None:
    return tf
  raise formats.CheckpointNotFoundError(
      f"{path} is not a checkpoint bert_jax can read: expected a directory with "
      f"{formats.NATIVE_CONFIG} (bert_jax), config.json + model.safetensors/pytorch_model.bin "
      "(HuggingFace), or a TF checkpoint (bert_model.ckpt.index + bert_config.json).")


# ----------------------------------------------------------------------------
# Loading into a model.

def _part(keys: Keys, encoder_only: bool) -> str:
  """Which part of the model a parameter belongs to: keys of a BertForPreTraining-shaped
  tree (the encoder under `bert`), or of the encoder alone."""
  poolers = ("pooler", "head")  # BERT's pooler; the modern encoders' prediction head
  if encoder_only:
    return "pooler" if keys[0] in poolers else "encoder"
  if keys[0] == "bert":
    return "pooler" if keys[1] in poolers else "encoder"
  if keys[0] in ("transform", "transform_LayerNorm", "output_bias", "decoder_bias", "lm_head"):
    return "masked-LM head"
  return "NSP head" if keys[0] == "seq_relationship" else "task head"


def _check_fits(path: str, want: dict[Keys, tuple], got: dict[Keys, tuple],
                encoder_only: bool, cfg: ModelConfig | None) -> tuple[list[str], list[str]]:
  """Fails unless the checkpoint's encoder fits the model; returns (parts the model has and
  the checkpoint lacks, which start fresh; parts the checkpoint has and the model does not
  use)."""
  part = lambda k: _part(k, encoder_only)
  missing = sorted(set(want) - set(got))
  unused = sorted(set(got) - set(want))
  problems = [f"missing {'/'.join(k)}" for k in missing if part(k) == "encoder"]
  problems += [f"unexpected {'/'.join(k)}" for k in unused if part(k) == "encoder"]
  problems += [f"{'/'.join(k)}: checkpoint {tuple(got[k])} vs model {tuple(want[k])}"
               for k in sorted(set(got) & set(want)) if tuple(got[k]) != tuple(want[k])]
  if problems:
    sizes = (f" ({cfg.num_layers} layers, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}, "
             f"{cfg.max_position_embeddings} positions)" if cfg is not None else "")
    raise formats.CheckpointMismatchError(
        f"init_checkpoint {path} does not fit the configured model{sizes}:\n  "
        + "\n  ".join(problems[:20]))
  return sorted({part(k) for k in missing}), sorted({part(k) for k in unused})


def _check_architecture(path: str, cfg: Any, config: Any) -> None:
  """Fails unless a checkpoint of another format (config `cfg`) has the configured model's
  family and architecture (dropout and the like may differ)."""
  if cfg.family != config.family:
    raise formats.CheckpointMismatchError(
        f"init_checkpoint {path} is a {cfg.family} model and config.model a "
        f"{config.family} one: set --config.model.family={cfg.family} (and its sizes).")
  fields = families.of(cfg).architecture_fields
  differ = [f"{f}: checkpoint {getattr(cfg, f)!r} vs config {getattr(config, f)!r}"
            for f in fields if getattr(cfg, f) != getattr(config, f)]
  if differ:
    raise formats.CheckpointMismatchError(
        f"init_checkpoint {path} was trained with another architecture; set config.model "
        "to match it:\n  " + "\n  ".join(differ))


def load_into(source: str | tuple[ModelConfig, Any], abstract_params: Any, fresh_params: Any,
              *, target: str = "pretraining", config: ModelConfig | None = None,
              name: str | None = None) -> Any:
  """The params of a model (`abstract_params`: ShapeDtypeStructs with the target shardings;
  `fresh_params`: its freshly initialised params) with the weights of `source` in place.

  `source`: a checkpoint path, or (config, host params) that `read` gave. `target`
  "pretraining": the model's tree is BertForPreTraining-shaped (encoder under `bert`, heads
  at the top); "encoder": only the model's `bert` encoder (+ pooler) is loaded (a
  fine-tuning model: its task head stays fresh). A run of ours is restored straight onto the
  shardings (its newest intact step); other sources are converted on the host. `config`:
  the configured model, whose architecture a checkpoint of another format must have.
  `name`: what the log calls the source (default: its path)."""
  encoder_only = target == "encoder"
  into = abstract_params["bert"] if encoder_only else abstract_params
  want = flat(into)
  path = name or (source if isinstance(source, str) else "the checkpoint")
  if isinstance(source, str) and is_run(source):
    loaded, fresh, extra = _load_run(source, path, into, encoder_only, config)
  else:
    loaded, fresh, extra = _load_converted(source, path, want, target, config)
  if fresh:
    logging.warning("init_checkpoint %s has no %s: %s from a fresh initialisation.", path,
                    " and no ".join(fresh), "they start" if len(fresh) > 1 else "it starts")
  if extra:
    logging.warning("init_checkpoint %s holds parts that this model does not use, left out: "
                    "%s (a model with data.nsp=False has no NSP head and no pooler).", path,
                    ", ".join(extra))
  fresh_flat = flat(fresh_params["bert"] if encoder_only else fresh_params)
  params = unflat({k: loaded.get(k, fresh_flat[k]) for k in want})
  return {**fresh_params, "bert": params} if encoder_only else params


def _load_run(source: str, path: str, abstract: Any, encoder_only: bool,
              config: ModelConfig | None) -> tuple[dict[Keys, Any], list[str], list[str]]:
  """`load_into` from a run of ours: (its newest intact step's params that `abstract`, the
  model's abstract params, has, flat and on their shardings; the parts it lacks; those the model
  does not use)."""
  want = flat(abstract)
  fit = {}

  def restore(step_dir):
    got = saved_param_shapes(step_dir)
    if encoder_only:
      got = {k[1:]: s for k, s in got.items() if k[0] == "bert"}
    layout = abstract if is_scanned(got) == is_scanned(want) else abstract_layout(
        abstract, is_scanned(got))
    in_layout = flat(layout)
    fit["parts"] = _check_fits(path, {k: tuple(a.shape) for k, a in in_layout.items()}, got,
                               encoder_only, config)
    subset = unflat({k: a for k, a in in_layout.items() if k in got})
    params = _restore_params(step_dir, {"bert": subset} if encoder_only else subset)
    return params["bert"] if encoder_only else params

  step_dir, params = _newest_intact(source, restore)
  if is_scanned(flat(params)) != is_scanned(want):  # saved with the other scan_layers
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          params)
    keys = set(flat(abstract_layout(shapes, is_scanned(want))))
    params = onto_layout_of(params, unflat({k: a for k, a in want.items() if k in keys}))
  logging.info("Initialised params from %s (step %s).", path, step_dir.name)
  return flat(params), *fit["parts"]


def _load_converted(source: str | tuple[ModelConfig, Any], path: str, want: dict[Keys, Any],
                    target: str, config: ModelConfig | None
                    ) -> tuple[dict[Keys, Any], list[str], list[str]]:
  """`load_into` from a checkpoint of another format (or the (config, host params) `read`
  gave), converted on the host and placed on the shardings of `want` (the flat abstract
  params): as `_load_run`."""
  if isinstance(source, str):
    cfg, host = read(source, target, require_mlm=False)
  else:
    cfg, host = source
  if config is not None:
    _check_architecture(path, cfg, config)
  host = flat(to_layout(host, is_scanned(want)))
  fresh, extra = _check_fits(path, {k: tuple(a.shape) for k, a in want.items()},
                             {k: np.shape(x) for k, x in host.items()}, target == "encoder", config)
  loaded = {k: jax.make_array_from_callback(
      a.shape, a.sharding, lambda idx, x=host[k], a=a: np.asarray(x, a.dtype)[idx])
            for k, a in want.items() if k in host}
  if isinstance(source, str):
    logging.info("Initialised params from converted checkpoint %s (%s).", path,
                 formats.describe_heads(formats.heads(unflat(host))))
  return loaded, fresh, extra


# ----------------------------------------------------------------------------
# The vocabulary a checkpoint comes with.

def checkpoint_vocab(checkpoint: str) -> str:
  """The vocabulary a checkpoint comes with: a directory holding vocab.txt / a SentencePiece
  model (HuggingFace, export), the vocab_path a fine-tuning run recorded in best/ (given the
  run or its best/), or the
  data.vocab_path of a pre-training run's newest checkpoint (relative: in the workdir); a
  Google TF checkpoint given by its prefix has it in its directory."""
  root = fileio.path(checkpoint)
  if not root.is_dir() and fileio.path(checkpoint + ".index").exists():
    root = root.parent  # a Google TF checkpoint by its prefix (.../bert_model.ckpt)
  recorded = []
  for directory in (root, best_dir.of(root)):
    try:
      tokenizer_lib.resolve_vocab_path(os.fspath(directory))
      return os.fspath(directory)
    except (FileNotFoundError, OSError):
      pass
  for best in (root, best_dir.of(root)):  # a fine-tuning run's best/, or the run
    saved = best_dir.recorded_task(best)
    if saved and saved.get("vocab_path"):
      recorded.append(saved["vocab_path"])
  if (root / "checkpoints").is_dir():
    for step in step_dirs(root):
      data = (_json_or_empty(step / "config" / "metadata").get("data") or {})
      if data.get("vocab_path"):
        recorded.append(data_config.in_workdir(data["vocab_path"], os.fspath(root)))
        break
  for path in recorded:
    try:
      tokenizer_lib.resolve_vocab_path(path)
      return path
    except (FileNotFoundError, OSError):
      pass
  raise formats.CheckpointNotFoundError(
      f"--vocab is not set and {checkpoint} holds no vocabulary"
      + (f" (the run recorded {', '.join(recorded)}, which is not there)" if recorded else "")
      + ": pass --vocab=PATH (the vocab.txt / SentencePiece model the model was trained with, "
      "or the directory holding it).")


def _json_or_empty(path) -> dict:
  try:
    value = json.loads(path.read_text())
    return value if isinstance(value, dict) else {}
  except (OSError, ValueError):
    return {}
