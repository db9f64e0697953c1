"""What a config names, each in one table: the model family (`config.model.family`) and the
pre-training objective (`config.objective`) with the model it trains and the inputs that
model takes (its feature schema); the objective counts its FLOPs (objectives.Objective).

    model, objective, sample = registry.pretraining(config, vocab_size)
    trainer = trainer.build(config, model, objective, sample, workdir)

A new pre-training objective is one `Pretraining` entry here, its factory in
bert_jax/objectives.py and, if it needs one, its model (bert_jax/models/bert.py); a new model
family is a Family record (bert_jax/families.py).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from absl import logging
import flax.linen as nn
import jax
import ml_collections
import numpy as np

from bert_jax import families
from bert_jax import formats
from bert_jax import loader
from bert_jax import objectives
from bert_jax.models import bert_formats
from common import errors
from common import fileio
from input_pipeline import pretrain as pretrain_data

def masked_lm(cfg: Any, nsp: bool) -> nn.Module:
  """The masked-LM model of the config's family (BERT's with NSP when `nsp`)."""
  return families.of(cfg).masked_lm(cfg, nsp)


@dataclasses.dataclass(frozen=True)
class Pretraining:
  """A pre-training objective and the model it trains."""
  # (model config, data config, the job's config) -> the model
  model: Callable[[Any, ml_collections.ConfigDict, ml_collections.ConfigDict], nn.Module]
  objective: Callable[[ml_collections.ConfigDict], objectives.Objective]  # the job's config ->
  # data config -> the per-row shape of each model input (what the init traces).
  inputs: Callable[[ml_collections.ConfigDict], dict[str, tuple[int, ...]]]
  about: str  # one line for --help and errors
  # data config -> a ConfigError when the data cannot serve this objective
  check: Callable[[ml_collections.ConfigDict], None] = lambda data_cfg: None
  # model config -> a ConfigError when its family cannot be trained this way
  check_model: Callable[[Any], None] = lambda cfg: None


def _mlm_inputs(data_cfg) -> dict[str, tuple[int, ...]]:
  length = (data_cfg.max_seq_length,)
  return {"input_ids": length, "segment_ids": length, "input_mask": length,
          "masked_lm_positions": (pretrain_data.predictions_per_row(data_cfg),)}


def _text_inputs(data_cfg) -> dict[str, tuple[int, ...]]:
  length = (data_cfg.max_seq_length,)
  return {"input_ids": length, "segment_ids": length, "input_mask": length}


def _electra_inputs(data_cfg) -> dict[str, tuple[int, ...]]:
  preds = (pretrain_data.predictions_per_row(data_cfg),)
  return {**_mlm_inputs(data_cfg), "masked_lm_ids": preds, "masked_lm_weights": preds}


def _ltr_family(cfg: Any) -> None:
  if families.of(cfg).causal_lm is None:
    raise errors.ConfigError("--config.objective=ltr is the paper's BERT ablation: it needs "
                             "--config.model.family=bert.")


def _no_nsp(data_cfg) -> None:
  if data_cfg.nsp:
    raise errors.ConfigError("--config.objective=ltr trains no next-sentence prediction (the "
                             "paper's \"LTR & No NSP\"): set --config.data.nsp=False (single "
                             "segments).")


def _electra_family(cfg: Any) -> None:
  if families.of(cfg).replaced_token_detection is None:
    raise errors.ConfigError("--config.objective=electra trains an ELECTRA generator and "
                             "discriminator: set --config.model.family=electra (and a preset, "
                             "e.g. --config.model.preset=electra-small).")


def _electra_model(cfg: Any, data_cfg, config) -> nn.Module:
  del data_cfg
  return families.of(cfg).replaced_token_detection(
      cfg, float(_electra_fields(config).generator_size))


def _electra_fields(config) -> ml_collections.ConfigDict:
  return config.get("electra") or ml_collections.ConfigDict(
      {"generator_size": 0.25, "discriminator_weight": 50.0})


def _electra_data(data_cfg) -> None:
  if data_cfg.nsp:
    raise errors.ConfigError("--config.objective=electra trains no next-sentence prediction: "
                             "set --config.data.nsp=False (single segments).")


PRETRAINING: dict[str, Pretraining] = {
    "mlm": Pretraining(
        model=lambda cfg, data_cfg, config: masked_lm(cfg, data_cfg.nsp),
        objective=lambda config: objectives.pretraining(), inputs=_mlm_inputs,
        about="masked LM, with next-sentence prediction when data.nsp (BERT)"),
    "ltr": Pretraining(
        model=lambda cfg, data_cfg, config: families.of(cfg).causal_lm(cfg),
        objective=lambda config: objectives.ltr(), inputs=_text_inputs, check=_no_nsp,
        check_model=_ltr_family,
        about="left-to-right LM, left-only attention (the paper's LTR & No NSP ablation)"),
    "electra": Pretraining(
        model=_electra_model,
        objective=lambda config: objectives.electra(
            float(_electra_fields(config).discriminator_weight)),
        inputs=_electra_inputs, check=_electra_data, check_model=_electra_family,
        about="replaced-token detection: a generator's masked LM and a discriminator that "
              "spots its samples (ELECTRA; config.electra)"),
}


def _choose(table: Mapping[str, Any], name: str, field: str) -> Any:
  if name not in table:
    raise errors.ConfigError(f"--config.{field}={name!r} is unknown: choose one of "
                             f"{', '.join(sorted(table))}.")
  return table[name]


def model_config(config: ml_collections.ConfigDict, vocab_size: int | None = None,
                 defaults: Mapping[str, Any] | None = None) -> Any:
  """config.model (a family, a preset and overrides; None = the preset's value) -> the
  model's config; `vocab_size` is the vocabulary's, used where the fields leave it unset;
  `defaults` (gpu_defaults') fill fields the config leaves unset; the architecture fields
  config.model has none for are config.init_checkpoint's own (checkpoint_fields)."""
  fields = dict(config.model)
  fields.pop("family", None)
  fields.update({k: v for k, v in (defaults or {}).items() if fields.get(k) is None})
  cfg = family(config).from_fields(fields, vocab_size)
  taken = {k: v for k, v in checkpoint_fields(config).items() if getattr(cfg, k) != v}
  if taken:
    logging.info("config.model has no field for %s: the model takes init_checkpoint %s's.",
                 ", ".join(f"{k}={v!r}" for k, v in taken.items()), config.init_checkpoint)
  return cfg.replace(**taken)


def checkpoint_fields(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The architecture fields (Family.architecture_fields) that config.model has no field for
  (layer_norm_eps, RoBERTa's position_offset, DeBERTa's relative positions, ...) as
  config.init_checkpoint's config has them, so that it trains on with what it was trained
  with; {} without one, or for one of another family (loader.load_into names that)."""
  chosen = family(config)
  unset = [f for f in chosen.architecture_fields if f not in config.model]
  path = config.get("init_checkpoint") or ""
  cfg = checkpoint_config(path) if path and unset else None
  if cfg is None or cfg.family != chosen.name:
    return {}
  return {f: getattr(cfg, f) for f in unset}


def checkpoint_config(path: str) -> Any | None:
  """The model config of the checkpoint at `path`, from its config file alone (no weights):
  a run's newest step's record, an export's, a HuggingFace directory's config.json or a
  Google TF checkpoint's bert_config.json; None where there is none."""
  d = fileio.path(path)
  if not loader.checkpoint_exists(path):
    return None
  if loader.is_run(path):
    steps = loader.step_dirs(path)
    return loader.recorded_model_config(steps[0]) if steps else None
  if (d / formats.NATIVE_CONFIG).exists():
    return formats.native_config(path)
  hf_family = families.of_hf_dir(path)
  if hf_family is not None:
    return hf_family.config_from_hf(formats.read_config_json(d / "config.json"))
  google = (d if d.is_dir() else d.parent) / "bert_config.json"
  return bert_formats.google_config(google) if google.exists() else None


def gpu_defaults(config: ml_collections.ConfigDict,
                 data_cfg: ml_collections.ConfigDict | None = None,
                 backend: str | None = None) -> dict[str, Any]:
  """The config.model fields a pre-training job chooses itself on `backend` (default JAX's):
  on GPU, those of the family's Family.gpu_defaults at the data's max_seq_length (data_cfg,
  default config.data) that config.model leaves unset (None); elsewhere none."""
  if (backend or jax.default_backend()) != "gpu":
    return {}
  data_cfg = data_cfg if data_cfg is not None else config.data
  chosen = family(config).gpu_defaults(int(data_cfg.max_seq_length), dict(config.model))
  return {k: v for k, v in chosen.items() if config.model.get(k) is None}


def family(config: ml_collections.ConfigDict) -> families.Family:
  """The Family that config.model.family names (default BERT)."""
  name = _choose({n: n for n in families.names()}, config.model.get("family", "bert"),
                 "model.family")
  return families.get(name)


def pretraining_config(config: ml_collections.ConfigDict, vocab_size: int | None = None,
                       data_cfg: ml_collections.ConfigDict | None = None,
                       backend: str | None = None) -> Any:
  """The model config pretraining() builds its model from, every check of the objective
  against the data and the family made (ConfigError), no module built: what a job checks
  before it builds its vocabulary (whose size `vocab_size` stands in for)."""
  entry = _choose(PRETRAINING, config.get("objective", "mlm"), "objective")
  data_cfg = data_cfg if data_cfg is not None else config.data
  entry.check(data_cfg)
  cfg = model_config(config, vocab_size, gpu_defaults(config, data_cfg, backend))
  entry.check_model(cfg)
  return cfg


def pretraining(config: ml_collections.ConfigDict, vocab_size: int | None = None,
                data_cfg: ml_collections.ConfigDict | None = None, backend: str | None = None
                ) -> tuple[nn.Module, objectives.Objective, dict[str, np.ndarray]]:
  """(model, objective, one sample row of the model inputs) that config.objective names for
  config.model and `data_cfg` (default config.data), with the fields the job chooses for
  `backend` (default JAX's; gpu_defaults)."""
  data_cfg = data_cfg if data_cfg is not None else config.data
  cfg = pretraining_config(config, vocab_size, data_cfg, backend)
  entry = PRETRAINING[config.get("objective", "mlm")]
  model = entry.model(cfg, data_cfg, config)
  sample = {k: np.ones((1,) + shape, np.int32) for k, shape in entry.inputs(data_cfg).items()}
  return model, entry.objective(config), sample
