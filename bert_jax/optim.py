"""Optimizers of the BERT recipes: AdamW (Devlin et al. 2018), LAMB (You et al. 2019) and
StableAdamW (AdamW with Adafactor-style update clipping, Wortsman et al. 2023; ModernBERT's).

All: global-norm clipping, then the optimizer with decoupled weight decay that skips norm
parameters and biases, then the learning rate: linear warmup + linear decay (BERT), or
warmup-stable-decay (`schedule.kind="wsd"`: warmup, a constant stretch, and a decay whose
start is a config field, so the decay can start from any checkpoint of a run). Master
weights and optimizer moments stay float32 whatever the compute dtype of the model.
"""
from __future__ import annotations

import re
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from common import errors

# As google-research/bert optimization.py: exclude_from_weight_decay, searched
# anywhere in the parameter's full name; the last two are the modern encoders' norms
# (attn_norm, final_norm, head/norm, ...: bert_jax/models/modern.py), as ModernBERT excludes them.
NO_DECAY_PATTERNS = ("LayerNorm", "layer_norm", "bias", r"_norm/", r"(^|/)norm/")


def _linear(init, end, steps):
  """Linear from `init` to `end` over `steps` (>= 1) steps, then `end`, with each argument
  a Python number or a traced scalar alike. The arithmetic is that of optax.linear_schedule
  as XLA compiles it with constant steps (`count / steps` becomes `count * (1 / steps)`), so
  that a step given these as inputs computes the same float32 learning rates."""
  def schedule(count):
    count = jnp.clip(count, 0, steps)
    return (init - end) * (1 - count * (1 / jnp.asarray(steps, jnp.float32))) + end
  return schedule


DECAY_SHAPES = ("linear", "1-sqrt")


def learning_rate_schedule(lr, warmup_steps, decay_steps, end_lr=0.0, decay_start=None,
                           shape: str = "linear") -> optax.Schedule:
  """Linear warmup from 0 to `lr` over `warmup_steps`, constant `lr` until `decay_start`
  (default: right after the warmup, BERT's schedule), then decay to `end_lr` at
  `decay_steps` (the schedule's end, which may exceed one run's steps): linear, or
  "1-sqrt" (lr scaled by 1 - sqrt(fraction of the decay done), WSD's usual cooldown).

  Every argument but `shape` may be a traced scalar: the train step takes them as inputs
  (`schedule_hparams`), so that runs differing only in them (a sweep's learning rates
  and epochs) share one compiled program."""
  if shape not in DECAY_SHAPES:
    raise ValueError(f"schedule.decay_shape={shape!r} unknown; choose one of {DECAY_SHAPES}.")
  start = warmup_steps if decay_start is None else decay_start
  warmup = _linear(0.0, lr, jnp.maximum(warmup_steps, 1))
  length = jnp.maximum(decay_steps - start, 1)
  if shape == "linear":
    decay = _linear(lr, end_lr, length)
  else:
    decay = lambda count: end_lr + (lr - end_lr) * (
        1 - jnp.sqrt(jnp.clip(count, 0, length) / jnp.asarray(length, jnp.float32)))
  if decay_start is None:  # BERT's: exactly the arithmetic of the releases before WSD
    return lambda step: jnp.where(step < warmup_steps, warmup(step), decay(step - start))
  return lambda step: jnp.where(step < warmup_steps, warmup(step),
                                jnp.where(step < start, lr, decay(step - start)))


def schedule_hparams(config: ml_collections.ConfigDict,
                     total_steps: int | None = None) -> dict[str, Any]:
  """config.schedule over `total_steps` (default config.num_train_steps) as the arguments
  of learning_rate_schedule: warmup_steps and decay_steps (0 = at the total), or a
  warmup_fraction of the total then decay to it."""
  s = config.schedule
  total = total_steps if total_steps is not None else config.num_train_steps
  if "warmup_fraction" in s:
    warmup, decay = int(s.warmup_fraction * total), total
  else:
    warmup, decay = s.warmup_steps, s.decay_steps or total
  out = {"lr": np.float32(config.opt.learning_rate), "warmup_steps": np.int32(warmup),
         "decay_steps": np.int32(decay), "end_lr": np.float32(s.end_learning_rate)}
  if s.get("kind", "linear") == "wsd":
    # decay_steps is the cooldown's length here; it ends at the total (or decay_start +
    # decay_steps when decay_start is set: the stable stretch then ends there).
    length = s.decay_steps
    start = s.get("decay_start") or total - length
    out.update(decay_start=np.int32(start), decay_steps=np.int32(start + length))
  elif s.get("kind", "linear") != "linear":
    raise ValueError(f"config.schedule.kind={s.kind!r} unknown; use 'linear' or 'wsd'.")
  return out


def schedule_shape(config: ml_collections.ConfigDict) -> str:
  return config.schedule.get("decay_shape", "linear")


def schedule_from_config(config: ml_collections.ConfigDict,
                         total_steps: int | None = None) -> optax.Schedule:
  """The learning-rate schedule of `config` over `total_steps` (schedule_hparams)."""
  return learning_rate_schedule(**schedule_hparams(config, total_steps),
                                shape=schedule_shape(config))


def _path_name(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def weight_decay_mask(params: Any) -> Any:
  """True where weight decay applies: not on norm parameters or any bias."""
  def decays(path, _):
    name = _path_name(path)
    return not any(re.search(p, name) for p in NO_DECAY_PATTERNS)
  return jax.tree_util.tree_map_with_path(decays, params)


class ScaleByAdamState(NamedTuple):
  count: jax.Array
  mu: Any
  nu: Any


def scale_by_adam(b1: float, b2: float, eps: float, bias_correction: bool
                  ) -> optax.GradientTransformation:
  """Adam's direction m / (sqrt(v) + eps), optionally without bias correction.

  The original BERT `AdamWeightDecayOptimizer` has no bias correction;
  optax.scale_by_adam always corrects, so this is the switchable variant.
  """
  def init(params):
    zeros = lambda p: jnp.zeros_like(p, dtype=jnp.float32)
    return ScaleByAdamState(jnp.zeros([], jnp.int32), jax.tree.map(zeros, params),
                            jax.tree.map(zeros, params))

  def update(grads, state, params=None):
    del params
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, grads)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, grads)
    count = optax.safe_increment(state.count)
    if bias_correction:
      c1 = 1 - b1 ** count.astype(jnp.float32)
      c2 = 1 - b2 ** count.astype(jnp.float32)
    else:
      c1 = c2 = 1.0
    updates = jax.tree.map(lambda m, v: (m / c1) / (jnp.sqrt(v / c2) + eps), mu, nu)
    return updates, ScaleByAdamState(count, mu, nu)

  return optax.GradientTransformation(init, update)


def make_optimizer(config: ml_collections.ConfigDict, total_steps: int | None = None,
                   hparams: dict[str, Any] | None = None) -> optax.GradientTransformation:
  """clip -> (adamw | lamb) with masked weight decay -> learning rate schedule (over
  `total_steps`, default config.num_train_steps; or of `hparams`, schedule_hparams' values,
  possibly traced)."""
  opt = config.opt
  schedule = learning_rate_schedule(**(hparams if hparams is not None else
                                       schedule_hparams(config, total_steps)),
                                    shape=schedule_shape(config))
  clip = optax.clip_by_global_norm(opt.grad_clip_norm) if opt.grad_clip_norm else optax.identity()
  if opt.name == "adamw":
    direction = [scale_by_adam(opt.b1, opt.b2, opt.eps, opt.bias_correction),
                 optax.add_decayed_weights(opt.weight_decay, mask=weight_decay_mask)]
  elif opt.name == "stableadamw":
    # AdamW whose update is clipped per tensor to RMS <= 1 (Adafactor's update clipping),
    # the learning rate of a tensor with a sudden gradient spike thereby cut.
    direction = [scale_by_adam(opt.b1, opt.b2, opt.eps, opt.bias_correction),
                 optax.clip_by_block_rms(1.0),
                 optax.add_decayed_weights(opt.weight_decay, mask=weight_decay_mask)]
  elif opt.name == "lamb":
    # Layer-wise trust ratio ||w|| / ||update|| on Adam's direction (with weight decay).
    direction = [scale_by_adam(opt.b1, opt.b2, opt.eps, opt.bias_correction),
                 optax.add_decayed_weights(opt.weight_decay, mask=weight_decay_mask),
                 optax.scale_by_trust_ratio()]
  else:
    raise ValueError(f"config.opt.name={opt.name!r} unknown; use 'adamw', 'stableadamw' or "
                     "'lamb'.")
  tx = optax.chain(clip, *direction, optax.scale_by_learning_rate(schedule))
  return frozen_encoder(tx) if config.get("freeze_encoder", False) else tx


def frozen_encoder(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """`tx` on every parameter but the encoder's (`bert`), which gets no optimizer state and
  updates of -0.0: p + (-0.0) is p bit for bit (feature-based fine-tuning)."""
  head = lambda tree: {k: v for k, v in tree.items() if k != "bert"}

  def init(params):
    return tx.init(head(params))

  def update(grads, state, params=None):
    updates, state = tx.update(head(grads), state, None if params is None else head(params))
    if "bert" in grads:
      updates = {**updates, "bert": jax.tree.map(lambda g: jnp.full_like(g, -0.0), grads["bert"])}
    return updates, state

  return optax.GradientTransformation(init, update)


def host_learning_rate(config: ml_collections.ConfigDict, step: int,
                       total_steps: int | None = None) -> float:
  """The learning rate applied at `step` (for logs), computed on the host."""
  return float(np.asarray(schedule_from_config(config, total_steps)(step)))


def config_error(field: str, value: Any, why: str) -> errors.ConfigError:
  """One line naming the config field, its value and what works."""
  return errors.ConfigError(f"--config.{field}={value}: {why}")


def check_config(config: ml_collections.ConfigDict) -> None:
  """config.opt and config.schedule, checked before any work: a value that cannot work is a
  ConfigError naming the field and what works."""
  opt, get, bad = config.opt, lambda node, k, d=None: node.get(k, d), config_error
  number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)
  if not number(opt.learning_rate) or opt.learning_rate <= 0:
    raise bad("opt.learning_rate", opt.learning_rate, "the learning rate must be a positive "
              "number (a negative one trains by gradient ascent), e.g. 1e-4.")
  if not number(opt.grad_clip_norm) or opt.grad_clip_norm < 0:
    raise bad("opt.grad_clip_norm", opt.grad_clip_norm, "the gradient clipping norm must be "
              "positive, or 0 for no clipping (a negative one flips every gradient).")
  if not number(opt.weight_decay) or opt.weight_decay < 0:
    raise bad("opt.weight_decay", opt.weight_decay, "weight decay must be 0 or positive.")
  for k in ("b1", "b2"):
    if not number(opt[k]) or not 0 <= opt[k] < 1:
      raise bad(f"opt.{k}", opt[k], "Adam's decay rates must be in [0, 1), e.g. 0.9 / 0.999.")
  if not number(opt.eps) or opt.eps <= 0:
    raise bad("opt.eps", opt.eps, "must be positive, e.g. 1e-6.")
  sched = config.schedule
  for k in ("warmup_steps", "decay_steps"):
    if k in sched and sched[k] < 0:
      raise bad(f"schedule.{k}", sched[k], "must be 0 or more steps.")
  if "warmup_fraction" in sched and not 0 <= sched.warmup_fraction <= 1:
    raise bad("schedule.warmup_fraction", sched.warmup_fraction, "must be in [0, 1].")
  if get(sched, "kind", "linear") not in ("linear", "wsd"):
    raise bad("schedule.kind", sched.kind, "linear (BERT: warmup, then linear decay) or wsd "
              "(warmup, stable, decay).")
  if get(sched, "decay_shape", "linear") not in DECAY_SHAPES:
    raise bad("schedule.decay_shape", sched.decay_shape, f"one of {DECAY_SHAPES}.")
  if get(sched, "decay_start") is not None and (get(sched, "kind") != "wsd"
                                                 or sched.decay_start < 0):
    raise bad("schedule.decay_start", sched.decay_start, "the step where a wsd schedule's "
              "decay begins (0 or more, with schedule.kind=wsd); None: its last decay_steps.")
  if opt.name not in ("adamw", "stableadamw", "lamb"):
    raise bad("opt.name", opt.name, "adamw (BERT), stableadamw (ModernBERT) or lamb.")
