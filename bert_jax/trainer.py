"""One setup and one loop for every job: pre-training and each fine-tuning task.

    trainer = build(config, model, objective, sample_batch, workdir)
    state, data_state = trainer.restore_or_init()
    result = run(trainer, state, train_iter, num_steps=..., evaluate=..., eval_at=...)

`build` states the sharding once: mesh and logical-axis rules (the model family's unless
the config sets them), the state's shapes from `jax.eval_shape` of the init, their
shardings from the parameters' logical names, a jitted init that creates the state
already sharded, the jitted train and eval steps (state donated), the optimizer and the
Checkpointer. `run` is the loop:
metrics read one step late, console progress and TensorBoard, evaluation and checkpoint
cadence, SIGTERM (preemption) save, NaN/Inf stop, and resume through the iterator's
`get_state()`. A job (bert_jax/train.py, bert_jax/finetune.py) picks model, objective,
data and evaluation; the `Objective` owns the inputs, loss and metric sums, the FLOPs the
progress lines count, and the random streams its model draws from.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import signal
import threading
import time
from typing import Any, Callable, Iterator, Mapping

from absl import logging
import flax.linen as nn
from flax import struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bert_jax import checkpointing
from bert_jax import families
from bert_jax import flops as flops_lib
from bert_jax import loader
from bert_jax import metrics as metrics_lib
from bert_jax import optim
from bert_jax import sharding
from bert_jax.objectives import Objective


class TrainState(struct.PyTreeNode):
  """Everything a checkpoint must hold to continue bit-identically (plus the data position)."""
  step: jax.Array  # int32 scalar: updates applied so far
  params: Any  # float32 master weights
  opt_state: Any  # float32 optimizer moments (+ counters)


def _microbatches(batch: dict[str, jax.Array], n: int) -> dict[str, jax.Array]:
  """[B, ...] -> [n, B/n, ...]; micro-batch i holds rows i, n+i, 2n+i, ... so that each
  device's rows split locally (no data movement under batch sharding)."""
  def split(x):
    x = jnp.swapaxes(x.reshape((x.shape[0] // n, n) + x.shape[1:]), 0, 1)
    return nn.with_logical_constraint(x, (None, "activation_batch") + (None,) * (x.ndim - 2))
  return jax.tree.map(split, batch)


def train_step(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array, *,
               model: nn.Module, tx: optax.GradientTransformation, objective: Objective,
               micro_steps: int = 1) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer update on the global batch, accumulated over `micro_steps` micro-batches.

  Losses are normalised by the *global* batch's denominators, so the summed micro-batch
  gradients equal the gradient of the full batch.
  """
  rng = jax.random.fold_in(rng, state.step)
  denominators = objective.denominators(batch)

  def loss_fn(params, micro, micro_rng):
    outputs = objective.apply(model, params, micro, deterministic=False,
                              rngs=objective.rngs(micro_rng, train=True))
    sums = objective.sums(outputs, micro)
    return objective.loss(sums, denominators), sums

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if micro_steps == 1:
    (loss, sums), grads = grad_fn(state.params, batch, jax.random.fold_in(rng, 0))
  else:
    def accumulate(carry, xs):
      micro, i = xs
      (l, s), g = grad_fn(state.params, micro, jax.random.fold_in(rng, i))
      return jax.tree.map(jnp.add, carry, (l, s, g)), None
    micro = _microbatches(batch, micro_steps)
    first = jax.tree.map(lambda x: x[0], micro)
    zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype),
                         jax.eval_shape(grad_fn, state.params, first, rng))
    (loss, sums, grads), _ = jax.lax.scan(
        accumulate, (zeros[0][0], zeros[0][1], zeros[1]), (micro, jnp.arange(micro_steps)))

  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = dict(sums, loss=loss, grad_norm=optax.global_norm(grads),
                 param_norm=optax.global_norm(params))
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params: Any, batch: dict[str, jax.Array], rng: jax.Array, *, model: nn.Module,
              objective: Objective, outputs: bool = False) -> Any:
  """The objective's metric sums of `batch` (no dropout), with the model's outputs too when
  `outputs` (fine-tuning's dev predictions): (sums, outputs)."""
  out = objective.apply(model, params, batch, deterministic=True,
                        rngs=objective.rngs(rng, train=False))
  sums = objective.sums(out, batch)
  return (sums, out) if outputs else sums


def init_state(rng: jax.Array, *, model: nn.Module, tx: optax.GradientTransformation,
               sample_batch: Mapping[str, Any], inputs: tuple[str, ...]) -> TrainState:
  """A fresh TrainState with *boxed* (logically named) params and optimizer state; the
  model is initialised on `sample_batch[k] for k in inputs` (only shapes matter)."""
  params = model.init({"params": rng}, *(jnp.asarray(sample_batch[k]) for k in inputs))["params"]
  # tx.init maps over the boxed params, so moments inherit their logical axes.
  return TrainState(step=jnp.zeros([], jnp.int32), params=params, opt_state=tx.init(params))


def check_config(config: ml_collections.ConfigDict) -> None:
  """The fields every job reads (optimizer and schedule: optim.check_config; cadences),
  checked before any work: a value that cannot work is a ConfigError naming the field and
  what works. 0 turns a cadence off (checkpoints then only at the end, at epoch ends and on
  SIGTERM)."""
  optim.check_config(config)
  bad, get = optim.config_error, lambda node, k, d=None: node.get(k, d)
  for k, what in (("checkpoint_every_steps", "steps between checkpoints"),
                  ("log_every_steps", "steps between progress lines"),
                  ("keep_checkpoint_period", "keeps every step divisible by it")):
    if get(config, k, 0) < 0:
      raise bad(k, config[k], f"{what}: 0 = off, or a positive number of steps.")
  if get(config, "keep_checkpoints", 1) < 1:
    raise bad("keep_checkpoints", config.keep_checkpoints, "at least the newest checkpoint "
              "must be kept (1 or more).")
  if get(config, "grad_accum_steps", 1) < 1:
    raise bad("grad_accum_steps", config.grad_accum_steps, "micro-batches per step: 1 or more.")
  if get(config, "max_steps_per_run", -1) == 0 or get(config, "max_steps_per_run", -1) < -1:
    raise bad("max_steps_per_run", config.max_steps_per_run, "a positive number of steps, "
              "or -1 for no limit.")


def logical_rules(config: ml_collections.ConfigDict, model: nn.Module
                  ) -> tuple[tuple[str, Any], ...]:
  """config.logical_axis_rules as hashable tuples (ConfigDict turns tuples into lists); unset:
  the rules of `model`'s family."""
  rules = config.get("logical_axis_rules")
  if rules is None:
    return families.of(model.config).sharding_rules
  return tuple((name, tuple(ax) if isinstance(ax, list) else ax) for name, ax in rules)


def abstract_state(init: Callable[[jax.Array], Any], rng: jax.Array, mesh: jax.sharding.Mesh,
                   rules) -> tuple[Any, Any]:
  """(abstract state, shardings) of `init(rng)`: ShapeDtypeStructs carrying their shardings
  (a restore target for Orbax), from the logical axis names; nothing is allocated."""
  boxed = jax.eval_shape(init, rng)
  shardings = sharding.logical_shardings(boxed, mesh, rules)
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          sharding.strip_boxes(boxed), shardings)
  return abstract, shardings


@dataclasses.dataclass
class Trainer:
  """Everything `build` sets up for one job; `run` drives it."""
  config: ml_collections.ConfigDict
  model: nn.Module
  objective: Objective
  tx: optax.GradientTransformation
  mesh: jax.sharding.Mesh
  rules: tuple[tuple[str, Any], ...]
  abstract: Any  # TrainState of ShapeDtypeStructs with shardings
  state_shardings: Any
  batch_sharding: jax.sharding.NamedSharding
  replicated: jax.sharding.NamedSharding
  init: Callable[[], TrainState]  # jitted: a fresh state, already sharded
  train_step: Callable  # jitted (state, global batch, rng) -> (state, metrics); state donated
  # jitted (params, global batch, rng) -> metric sums, or (sums, model outputs) when built
  # with eval_outputs (replicated)
  eval_step: Callable
  checkpointer: checkpointing.Checkpointer | None
  # The progress lines and TensorBoard of `run` (build's, from the objective, with a
  # workdir): made on first use, so a run refused at restore writes nothing.
  make_metrics: Callable[[], metrics_lib.TrainMetrics] | None = None
  # What the run is made from, by name (e.g. fingerprints of its data and initial weights;
  # names without dots): saved with every checkpoint; a resume from other inputs is refused
  # (InputsChangedError).
  inputs: Mapping[str, Any] | None = None
  total_steps: int | None = None  # the learning-rate schedule's length
  restored_config: Mapping[str, Any] | None = None  # the config of the checkpoint resumed
  _metrics: metrics_lib.TrainMetrics | None = dataclasses.field(default=None, repr=False)
  _ahead: Any = dataclasses.field(default=None, repr=False)  # compile_ahead's thread's result

  @property
  def metrics(self) -> metrics_lib.TrainMetrics | None:
    if self._metrics is None and self.make_metrics is not None:
      self._metrics = self.make_metrics()
    return self._metrics

  @contextlib.contextmanager
  def activate(self) -> Iterator[None]:
    """The mesh and logical-axis rules under which the model traces."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      yield

  def to_global(self, batch: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
    """This host's rows of a global batch -> global jax.Arrays on the batch sharding."""
    return sharding.host_to_global(batch, self.batch_sharding)

  def abstract_args(self, batch_shapes: Mapping[str, tuple[tuple[int, ...], Any]]):
    """(state, global batch, rng) of the train step as ShapeDtypeStructs carrying their
    shardings: what the step is lowered for without data. `batch_shapes`: {feature:
    (global shape, dtype)}, e.g. input_pipeline.pretrain.batch_shapes."""
    batch = {k: jax.ShapeDtypeStruct(shape, dtype, sharding=self.batch_sharding)
             for k, (shape, dtype) in batch_shapes.items()}
    key = jax.eval_shape(lambda: jax.random.key(0))
    return self.abstract, batch, jax.ShapeDtypeStruct(key.shape, key.dtype,
                                                      sharding=self.replicated)

  def compile_ahead(self, batch_shapes: Mapping[str, tuple[tuple[int, ...], Any]]) -> None:
    """Starts compiling the train step for global batches of `batch_shapes` in a background
    thread, from the abstract state, so that XLA compiles it while the state is initialised
    or restored and the input pipeline starts (XLA releases the GIL while it compiles): on
    BERT-base (CPU) the first step comes ~4 s sooner. `run` takes the result for its first
    batch; a batch that does not match it is stepped by the jitted step as before."""
    args = self.abstract_args(batch_shapes)
    result: dict[str, Any] = {}

    def compile_step():
      t = time.perf_counter()
      try:
        with self.activate():
          result["step"] = self.train_step.lower(*args).compile()
      except Exception as e:  # pylint: disable=broad-except  (the jitted step still works)
        result["error"] = e
      result["seconds"] = time.perf_counter() - t

    # Not a daemon: a process that ends while XLA compiles in a daemon thread aborts ("FATAL:
    # exception not rethrown"), e.g. a rerun with nothing left to train; it waits instead.
    thread = threading.Thread(target=compile_step, name="compile_ahead")
    thread.start()
    self._ahead = (thread, result)

  def compiled_ahead(self, fallback: bool = True) -> Callable | None:
    """compile_ahead's step (waiting for it), once; None without one or when it failed
    (`fallback=False`: its compilation's error is raised instead)."""
    if self._ahead is None:
      return None
    (thread, result), self._ahead = self._ahead, None
    thread.join()
    if "error" in result:
      if not fallback:
        raise result["error"]
      logging.warning("Compiling the train step ahead failed (%s); the first step compiles "
                      "it instead.", result["error"])
      return None
    logging.info("Train step compiled ahead in %.1fs, beside initialisation.",
                 result["seconds"])
    return result["step"]

  @property
  def train_rng(self) -> jax.Array:
    """The key every step's random streams derive from (folded with the step)."""
    return jax.random.fold_in(jax.random.key(self.config.seed), 1)

  @property
  def eval_rng(self) -> jax.Array:
    """The key evaluation's random streams (the objective's, if any) derive from."""
    return jax.random.fold_in(jax.random.key(self.config.seed), 2)

  @property
  def writer(self):
    return self.metrics.writer

  def restore_or_init(self, init_from: str | tuple[Any, Any] | None = None, *,
                      target: str = "pretraining", model_config: Any = None,
                      name: str | None = None) -> tuple[TrainState, Any]:
    """(state, this process's data state or None): the newest restorable checkpoint of the
    workdir (its saved config then in `self.restored_config`), else a fresh state, with the
    weights of `init_from` in place when given (a checkpoint path, or (config, host params)
    that loader.read gave: loader.load_into with `target`, `model_config`, `name`)."""
    restored = self.checkpointer.restore(self.abstract, self.config) if self.checkpointer else None
    if restored is not None:
      step, state, data_state, self.restored_config = restored
      self._check_resume(step, self.restored_config)
      logging.info("Resumed from %s/%d.", self.checkpointer.directory, step)
      return state, data_state
    with self.activate():
      state = self.init()
    if init_from is not None:
      state = state.replace(params=loader.load_into(
          init_from, self.abstract.params, state.params, target=target, config=model_config,
          name=name))
    return state, None

  def _check_resume(self, step: int, saved_cfg: Mapping[str, Any]) -> None:
    """Refuses a resume whose inputs (`self.inputs`) differ from those the checkpoint was
    made from; warns when the schedule's length changed (the learning rate jumps)."""
    saved_inputs = saved_cfg.get(checkpointing.INPUTS_KEY) or {}
    step_dir = self.checkpointer.directory / str(step)
    changed = [name for name, value in (self.inputs or {}).items()
               if name in saved_inputs and saved_inputs[name] != value]
    if changed:
      fields = checkpointing.config_changes(saved_cfg, json_config(self.config))
      raise checkpointing.InputsChangedError(
          f"The checkpoints in {self.checkpointer.directory} (latest: step {step}) were trained "
          f"from other inputs than this command's: the {', '.join(changed)} differ (compared "
          "by content); nothing was moved or changed.\n"
          + ("  Config fields that differ from the saved run's:\n    "
             + "\n    ".join(fields[:12]) + "\n" if fields else "")
          + f"  Rerun with the run's own inputs (its config is saved in {step_dir / 'config'}), "
          "or train with these in another --workdir.")
    saved_total = saved_cfg.get(checkpointing.SCHEDULE_KEY)
    if self.total_steps is None or saved_total in (None, self.total_steps):
      return
    before = optim.host_learning_rate(self.config, step, saved_total)
    after = optim.host_learning_rate(self.config, step, self.total_steps)
    if not np.isclose(before, after, rtol=1e-6, atol=0.0):  # e.g. a fixed decay_steps: no jump
      logging.warning(
          "The learning-rate schedule now spans %d steps, not %d as when step %d was saved "
          "(e.g. more epochs or num_train_steps): at step %d the learning rate goes from "
          "%.3g to %.3g and decays anew to the end.", self.total_steps, saved_total, step, step,
          before, after)

  def saved_with_config(self) -> dict[str, Any]:
    """What each checkpoint records beside the run's config: the model, inputs and schedule."""
    return {loader.MODEL_CONFIG_KEY: self.model.config.to_dict(),
            checkpointing.INPUTS_KEY: dict(self.inputs or {}),
            checkpointing.SCHEDULE_KEY: self.total_steps}

  def num_params(self) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(self.abstract.params))


def json_config(config: ml_collections.ConfigDict) -> dict:
  return json.loads(config.to_json_best_effort())


def build(config: ml_collections.ConfigDict, model: nn.Module, objective: Objective,
          sample_batch: Mapping[str, Any], workdir: str | None, *,
          eval_batch_size: int | None = None, total_steps: int | None = None,
          devices=None, inputs: Mapping[str, Any] | None = None, eval_outputs: bool = False,
          log_prefix: Callable[[int], str] | None = None) -> Trainer:
  """Mesh, rules, sharded state shapes, jitted init/train/eval steps, optimizer and (with a
  workdir) the Checkpointer and the progress metrics of a job, from its config, model,
  objective and one sample batch (any number of rows: only the shapes of
  `objective.inputs` are used). `devices` (default: all) may be compile-only topology
  devices: nothing runs here. `total_steps` (default config.num_train_steps) is the
  learning-rate schedule's length. `inputs` names what the run is made from (see
  Trainer.inputs). `eval_outputs`: the eval step returns the model's outputs beside the
  sums. `log_prefix(step)` may start each progress line (e.g. the epoch)."""
  check_config(config)
  tx = optim.make_optimizer(config, total_steps)
  mesh = sharding.make_mesh(config.mesh_shape, devices)
  rules = logical_rules(config, model)
  micro = int(config.get("grad_accum_steps", 1))
  sharding.check_batch_size(config.global_batch_size, micro, mesh, rules)
  if eval_batch_size:
    sharding.check_batch_size(eval_batch_size, 1, mesh, rules, name="eval_batch_size")
  sample = {k: np.asarray(sample_batch[k])[:1] for k in objective.inputs}
  init = functools.partial(init_state, model=model, tx=tx, sample_batch=sample,
                           inputs=objective.inputs)
  rng = jax.random.key(config.seed)
  # Shapes and logical names only: no mesh context (a concrete key under a mesh of
  # topology devices would try to run on them).
  with nn.logical_axis_rules(rules):
    abstract, state_sh = abstract_state(init, rng, mesh, rules)
  jit_init = jax.jit(lambda r: nn.unbox(init(r)), out_shardings=state_sh)
  batch_sh = sharding.batch_sharding(mesh, rules)
  repl = sharding.replicated(mesh)
  # The schedule's numbers are inputs of the step, not constants of its program: runs that
  # differ only in learning rate or length (a fine-tuning sweep) share one compiled step.
  def scheduled_step(state, batch, rng, hparams):
    return train_step(state, batch, rng, model=model, objective=objective, micro_steps=micro,
                      tx=optim.make_optimizer(config, hparams=hparams))
  p_train = Bound(jax.jit(scheduled_step, in_shardings=(state_sh, batch_sh, repl, repl),
                          out_shardings=(state_sh, repl), donate_argnums=(0,)),
                  (optim.schedule_hparams(config, total_steps),))
  p_eval = jax.jit(functools.partial(eval_step, model=model, objective=objective,
                                     outputs=eval_outputs),
                   in_shardings=(state_sh.params, batch_sh, repl), out_shardings=repl)
  total_steps = total_steps if total_steps is not None else config.get("num_train_steps")
  ckpt = make_metrics = None
  if workdir is not None:
    ckpt = checkpointing.Checkpointer(workdir, keep=config.keep_checkpoints,
                                      keep_period=config.keep_checkpoint_period,
                                      async_save=config.async_checkpointing)
    make_metrics = functools.partial(_progress, config, model, objective, sample, workdir,
                                     total_steps, log_prefix)
  return Trainer(config=config, model=model, objective=objective, tx=tx, mesh=mesh, rules=rules,
                 abstract=abstract, state_shardings=state_sh, batch_sharding=batch_sh,
                 replicated=repl, init=functools.partial(jit_init, rng), train_step=p_train,
                 eval_step=p_eval, checkpointer=ckpt, make_metrics=make_metrics, inputs=inputs,
                 total_steps=total_steps)


def _progress(config, model: nn.Module, objective: Objective, sample: Mapping[str, Any],
              workdir: str, total_steps: int | None,
              log_prefix: Callable[[int], str] | None) -> metrics_lib.TrainMetrics:
  """A run's progress lines and TensorBoard summaries (tokens/s, MFU, ETA)."""
  shapes = {k: (config.global_batch_size,) + v.shape[1:] for k, v in sample.items()}
  return metrics_lib.TrainMetrics(
      metrics_lib.make_writer(workdir), total_steps=total_steps,
      tokens_per_step=int(np.prod(shapes["input_ids"])),
      flops_per_step=objective.flops(model, shapes),
      peak=flops_lib.Peak(str(model.config.dtype), config.peak_flops_per_device),
      learning_rate=functools.partial(optim.host_learning_rate, config, total_steps=total_steps),
      summarize=objective.summarize, console=objective.console, prefix=log_prefix)


@dataclasses.dataclass(frozen=True)
class Bound:
  """A jitted function with its trailing arguments bound: called, lowered and compiled
  without them (Trainer.train_step is `(state, batch, rng)`; the schedule's numbers come
  last). Other attributes are those of the function (or of its lowered/compiled form)."""
  fn: Any  # jitted, lowered or compiled
  args: tuple

  def __call__(self, *args):
    return self.fn(*args, *self.args)

  def lower(self, *args, **kwargs) -> Bound:
    return Bound(self.fn.lower(*args, *self.args, **kwargs), self.args)

  def compile(self, *args, **kwargs) -> Bound:
    return Bound(self.fn.compile(*args, **kwargs), self.args)

  def __getattr__(self, name: str):
    return getattr(self.fn, name)


class Preemption:
  """SIGTERM -> save a checkpoint at the next step and exit cleanly. With several
  processes, Orbax's preemption sync point makes all of them stop at one step."""

  def __init__(self, checkpointer: checkpointing.Checkpointer):
    self.checkpointer = checkpointer
    self.requested = False
    self._previous = None
    if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del frame
    logging.warning("Received signal %d: checkpointing and stopping.", signum)
    self.requested = True

  def __call__(self, step: int) -> bool:
    if jax.process_count() > 1:
      self.requested = bool(self.checkpointer.manager.reached_preemption(step))
    return self.requested

  def restore(self) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def evaluate_sums(trainer: Trainer, params: Any, batches, outputs: list | None = None
                  ) -> dict[str, float]:
  """Metric sums of the eval step over host-local `batches` (summed over the global batch):
  the one evaluation loop of every job. `outputs` (a trainer built with eval_outputs): a
  list that receives each batch's model outputs, on the host."""
  sums = None
  with trainer.activate():
    for i, batch in enumerate(batches):
      m = trainer.eval_step(params, trainer.to_global(batch),
                            jax.random.fold_in(trainer.eval_rng, i))
      if outputs is not None:
        m, out = m
        outputs.append(jax.device_get(out))
      sums = m if sums is None else jax.tree.map(jnp.add, sums, m)
  return {k: float(v) for k, v in jax.device_get(sums).items()}


@dataclasses.dataclass
class RunResult:
  state: TrainState
  step: int  # updates applied when the loop ended
  preempted: bool


def _every(step: int, period: int) -> bool:
  """Whether a cadence of `period` steps (0 = off) falls on `step`."""
  return period > 0 and step % period == 0


def first_step(trainer: Trainer, state: TrainState, batch, rng):
  """(state, metrics, the step function for the steps after): the step compile_ahead made
  when there is one and the batch is what it was compiled for, else the jitted step."""
  compiled = trainer.compiled_ahead()
  if compiled is not None:
    try:
      return (*compiled(state, batch, rng), compiled)
    except (TypeError, ValueError) as e:  # checked before anything runs: nothing donated yet
      logging.warning("The batch does not match the train step compiled ahead (%s); "
                      "compiling it for this batch.", e)
  return (*trainer.train_step(state, batch, rng), trainer.train_step)


def _log_evaluate_save(trainer: Trainer, step: int, state: TrainState, train_iter, stop: bool,
                       evaluate: Callable[[int, TrainState], Any] | None, save: bool
                       ) -> int | None:
  """After step `step` was queued: its evaluation and checkpoint when due (a stop saves),
  its metrics reported now where that blocks anyway, else returned to be read one step
  late (None: nothing to read)."""
  config, metrics = trainer.config, trainer.metrics
  do_save = _every(step, config.checkpoint_every_steps) or save or stop
  log_step = None
  if _every(step, config.log_every_steps) or stop:
    if evaluate is not None or do_save:
      metrics.report(step)  # blocking here anyway
    else:
      log_step = step
  if evaluate is not None:
    metrics.check(step)
    evaluate(step, state)
  if do_save:
    metrics.check(step)  # never save a state whose loss went NaN
    trainer.checkpointer.save(step, state, train_iter.get_state(), config,
                              extra=trainer.saved_with_config())
  return log_step


def run(trainer: Trainer, state: TrainState, train_iter, *, num_steps: int,
        evaluate: Callable[[int, TrainState], Any] | None = None,
        eval_at: Callable[[int], bool] = lambda step: False,
        save_at: Callable[[int], bool] = lambda step: False) -> RunResult:
  """Trains from `state.step` to `num_steps` (or config.max_steps_per_run more).

  `train_iter` yields this host's rows of each global batch and has get_state() (saved with
  every checkpoint). Every config.log_every_steps the metrics of the steps so far are read
  (one step late, so the device never waits) and reported; `evaluate(step, state)` runs
  where `eval_at(step)`, before the checkpoint of that step; checkpoints are saved every
  config.checkpoint_every_steps, where `save_at(step)`, on SIGTERM and at the end. A
  non-finite loss stops the run without saving that state.
  """
  config, ckpt, metrics = trainer.config, trainer.checkpointer, trainer.metrics
  rng = trainer.train_rng
  preempted = Preemption(ckpt)
  start = int(jax.device_get(state.step))
  end = num_steps
  if config.get("max_steps_per_run", -1) > 0:
    end = min(end, start + config.max_steps_per_run)
  if start >= num_steps:
    logging.info("Training already reached step %d (num_train_steps=%d).", start, num_steps)
  log_step = None
  step = start
  train_step = trainer.train_step
  try:
    with trainer.activate():
      for step in range(start + 1, end + 1):  # `step` counts updates done after this one
        t0 = time.perf_counter()
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
          batch = trainer.to_global(next(train_iter))
          if step == start + 1:
            state, m, train_step = first_step(trainer, state, batch, rng)
          else:
            state, m = train_step(state, batch, rng)
        metrics.add(step, m, started=t0)
        if step == start + 1:
          jax.block_until_ready(m)
          logging.info("First step (compilation included) took %.1fs.", time.perf_counter() - t0)
          metrics.start_timer(step)
        if log_step is not None:  # read the previous log step now that this one is queued
          metrics.report(log_step)
        stop = preempted(step) or step == end
        log_step = _log_evaluate_save(trainer, step, state, train_iter, stop,
                                      evaluate if evaluate is not None and eval_at(step) else None,
                                      save_at(step))
        if stop:
          break
  except metrics_lib.NonFiniteLossError:
    ckpt.wait()
    logging.error("Stopping: non-finite loss. Checkpoints kept in %s (latest: step %s).",
                  ckpt.directory, ckpt.latest_step())
    raise
  finally:
    preempted.restore()
    ckpt.close()
    metrics.writer.flush()
  if preempted.requested:
    logging.warning("Preempted: saved step %d; rerun the same command to continue.", step)
  return RunResult(state=state, step=step, preempted=preempted.requested)
