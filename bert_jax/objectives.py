"""Objectives: what a train step optimises and what the logs show, in one place each.

An `Objective` names the model inputs, computes metric *sums* of a (micro-)batch and the
denominators over the global batch, and divides the one by the other into the loss (the
only place a loss is formed: sums-only functions below and in bert_jax/heads.py, so the
loss of a batch split into micro-batches equals the loss of the whole). It also turns
host-side sums into the scalars of the console and TensorBoard (`summarize`, `console`),
counts the model FLOPs of a step, and names the random streams its model draws from
besides dropout. The trainer and its logging read whatever the objective returns, so a
new objective is one factory here plus its line in bert_jax/registry.py.

  pretraining()          masked LM, plus NSP when the model has the NSP head
  ltr()                  a left-to-right LM (the paper's LTR ablation)
  electra(weight)        replaced-token detection: the generator's masked LM + `weight` x
                         the discriminator's per-token loss (ELECTRA)
  supervised(sums_fn)    a fine-tuning head's sums (heads.*_sums): classification,
                         regression, span QA, tagging, multiple choice

Packed rows (input_pipeline/packing.py) carry features.PACKED; an objective passes those the
batch has to the model by keyword, so packed and unpacked batches share one objective.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from flax import struct
import jax
import jax.numpy as jnp

from bert_jax import flops as flops_lib
from input_pipeline import features

@struct.dataclass
class Objective:
  """inputs / keyword_inputs: batch keys passed to the model positionally / by keyword
  (keyword ones only when the batch has them). sums(outputs, batch): metric sums of a
  (micro-)batch; denominators(batch): scalars over the *global* batch; loss(sums,
  denominators): the optimised scalar. summarize(sums) turns host-side sums into the
  scalars shown; `console` / `eval_console` list the (scalar, label) pairs printed after the
  loss on progress / evaluation lines; `count` names the sum printed as "N examples"."""
  inputs: tuple[str, ...] = struct.field(pytree_node=False)
  sums: Any = struct.field(pytree_node=False)  # (outputs, batch) -> dict of sums
  denominators: Any = struct.field(pytree_node=False)  # global batch -> dict of scalars
  loss: Any = struct.field(pytree_node=False)  # (sums, denominators) -> scalar loss
  summarize: Any = struct.field(pytree_node=False)  # host sums -> dict of scalars
  flops: Any = struct.field(pytree_node=False)  # (model, global batch shapes) -> FLOPs a step
  console: tuple[tuple[str, str], ...] = struct.field(pytree_node=False, default=())
  eval_console: tuple[tuple[str, str], ...] = struct.field(pytree_node=False, default=())
  count: str = struct.field(pytree_node=False, default="")
  keyword_inputs: tuple[str, ...] = struct.field(pytree_node=False, default=features.PACKED)
  rng_streams: tuple[str, ...] = struct.field(pytree_node=False, default=())
  # batch -> the batch its model reads (None: as it comes; ltr: the text restored).
  model_batch: Any = struct.field(pytree_node=False, default=None)

  def apply(self, model, params, batch, **kwargs):
    """model.apply on the objective's inputs of `batch`."""
    if self.model_batch is not None:
      batch = self.model_batch(batch)
    return model.apply({"params": params}, *(batch[k] for k in self.inputs),
                       **{k: batch[k] for k in self.keyword_inputs if k in batch}, **kwargs)

  def rngs(self, rng: jax.Array, train: bool) -> dict[str, jax.Array]:
    """The named random streams of one (micro-)batch: dropout (in training) and those the
    objective declares (`rng_streams`), each its own key derived from `rng`."""
    out = {"dropout": rng} if train else {}
    out.update({name: jax.random.fold_in(rng, i + 1) for i, name in enumerate(self.rng_streams)})
    return out

  def batch_loss(self, outputs, batch) -> jax.Array:
    """The loss of one whole batch (its own denominators)."""
    return self.loss(self.sums(outputs, batch), self.denominators(batch))


# ----------------------------------------------------------- pre-training ----

def pretraining_sums(outputs: Mapping[str, jax.Array], batch: Mapping[str, jax.Array]
                     ) -> dict[str, jax.Array]:
  """Metric sums of masked LM (weighted cross-entropy over the masked positions) and, when
  the outputs hold "nsp_logits", NSP (cross-entropy per example). Examples may carry a
  weight (0 for padding rows of a ragged final batch, or for empty slots of a packed row)."""
  logits_BPV = outputs["mlm_logits"]
  ids_BP = batch["masked_lm_ids"].astype(jnp.int32)
  w_BP = batch["masked_lm_weights"].astype(jnp.float32)
  logp_BPV = jax.nn.log_softmax(logits_BPV, axis=-1)
  mlm_nll_BP = -jnp.take_along_axis(logp_BPV, ids_BP[..., None], axis=-1)[..., 0]
  labels = batch["next_sentence_labels"]
  ex_w_B = batch.get("example_weights", jnp.ones(labels.shape)).reshape(-1).astype(jnp.float32)
  sums = {
      "mlm_loss_sum": jnp.sum(mlm_nll_BP * w_BP),
      "mlm_correct_sum": jnp.sum((jnp.argmax(logits_BPV, -1) == ids_BP) * w_BP),
      "mlm_weight": jnp.sum(w_BP),
      "num_examples": jnp.sum(ex_w_B),
  }
  if "input_mask" in batch:  # real (non-padding) tokens: throughput that packing is measured by
    sums["num_tokens"] = jnp.sum(batch["input_mask"].astype(jnp.float32))
  if "nsp_logits" in outputs:
    # [B, 2], or [B, E, 2] for packed rows (E examples a row): flatten to examples.
    nsp_logits_B2 = outputs["nsp_logits"].reshape(-1, 2)
    labels_B = labels.reshape(-1).astype(jnp.int32)
    nsp_nll_B = -jnp.take_along_axis(jax.nn.log_softmax(nsp_logits_B2), labels_B[:, None],
                                     axis=-1)[:, 0]
    sums["nsp_loss_sum"] = jnp.sum(nsp_nll_B * ex_w_B)
    sums["nsp_correct_sum"] = jnp.sum((jnp.argmax(nsp_logits_B2, -1) == labels_B) * ex_w_B)
  return sums


def _pretraining_denominators(batch):
  mlm = jnp.maximum(jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)), 1e-8)
  if "example_weights" in batch:
    nsp = jnp.maximum(jnp.sum(batch["example_weights"].astype(jnp.float32)), 1e-8)
  else:
    nsp = jnp.float32(batch["next_sentence_labels"].shape[0])
  return {"mlm": mlm, "nsp": nsp}


def _pretraining_loss(sums, denominators):
  loss = sums["mlm_loss_sum"] / denominators["mlm"]
  if "nsp_loss_sum" in sums:  # a model with the NSP head (BertForPreTraining(nsp=True))
    loss = loss + sums["nsp_loss_sum"] / denominators["nsp"]
  return loss


def summarize_pretraining(sums: Mapping[str, float]) -> dict[str, float]:
  """Metric sums -> means and accuracies (NSP ones only when the model has the NSP head)."""
  mlm_w = max(sums["mlm_weight"], 1e-8)
  out = {"mlm_loss": sums["mlm_loss_sum"] / mlm_w, "mlm_accuracy": sums["mlm_correct_sum"] / mlm_w}
  # The paper's "LM ppl" (Table 6): exp of the mean masked-LM loss per predicted token.
  out["mlm_perplexity"] = math.exp(min(float(out["mlm_loss"]), 700.0))
  out["loss"] = out["mlm_loss"]
  if "nsp_loss_sum" in sums:
    n = max(sums["num_examples"], 1e-8)
    out["nsp_loss"] = sums["nsp_loss_sum"] / n
    out["nsp_accuracy"] = sums["nsp_correct_sum"] / n
    out["loss"] += out["nsp_loss"]
  return out


def _pretraining_flops(model, shapes: Mapping[str, tuple[int, ...]]) -> float:
  batch, length = shapes["input_ids"]
  preds = shapes["masked_lm_positions"][-1]
  last_rows = None  # the last layer at every row, unless only the heads' rows are computed
  if getattr(model, "head_rows", False) and preds < length and not model.config.scan_layers:
    last_rows = preds + (shapes.get("cls_positions", (1,))[-1] if model.nsp else 0)
  return flops_lib.train_flops_per_step(model.config, batch, length, preds, nsp=model.nsp,
                                        last_rows=last_rows)


def pretraining() -> Objective:
  """Masked LM + NSP, or masked LM alone for BertForPreTraining(nsp=False): the model's
  outputs (and so the sums) say which; packed rows (data.packing) need nothing more."""
  return Objective(
      inputs=features.PRETRAINING, sums=pretraining_sums,
      denominators=_pretraining_denominators, loss=_pretraining_loss,
      summarize=summarize_pretraining, flops=_pretraining_flops,
      console=(("mlm_accuracy", "mlm_acc"), ("nsp_accuracy", "nsp_acc")),
      eval_console=(("mlm_loss", "mlm_loss"), ("mlm_perplexity", "mlm_ppl"),
                    ("mlm_accuracy", "mlm_acc"),
                    ("nsp_loss", "nsp_loss"), ("nsp_accuracy", "nsp_acc")),
      count="num_examples")


# ---------------------------------------------------- left-to-right LM ----

def restore_text(batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
  """`batch` with the text the pipeline masked: every masked position (weight > 0) holds its
  original id again (masked_lm_ids), so a left-to-right LM reads the pre-training stream
  as it is, without a pipeline of its own."""
  ids_BL, pos_BP = jnp.asarray(batch["input_ids"]), jnp.asarray(batch["masked_lm_positions"], jnp.int32)
  now_BP = jnp.take_along_axis(ids_BL, pos_BP, axis=1)
  orig_BP = jnp.where(batch["masked_lm_weights"] > 0, batch["masked_lm_ids"].astype(ids_BL.dtype),
                      now_BP)
  rows_B1 = jnp.arange(ids_BL.shape[0])[:, None]
  return {**batch, "input_ids": ids_BL.at[rows_B1, pos_BP].set(orig_BP)}


def _next_token_weights(batch) -> jax.Array:
  """[B, L-1]: 1 where token t and t+1 are real and of one example (t predicts t+1)."""
  mask_BL = batch["input_mask"].astype(jnp.float32)
  w = mask_BL[:, 1:] * mask_BL[:, :-1]
  if "packed_example_ids" in batch:
    ex_BL = batch["packed_example_ids"]
    w = w * (ex_BL[:, 1:] == ex_BL[:, :-1])
  return w


def ltr_sums(outputs, batch) -> dict[str, jax.Array]:
  """Next-token cross-entropy sums over the real tokens (objectives.ltr)."""
  batch = restore_text(batch)
  logits_BLV = outputs["mlm_logits"][:, :-1]
  targets_BL = batch["input_ids"][:, 1:].astype(jnp.int32)
  w_BL = _next_token_weights(batch)
  nll_BL = -jnp.take_along_axis(jax.nn.log_softmax(logits_BLV, -1), targets_BL[..., None],
                                axis=-1)[..., 0]
  ex_w = batch.get("example_weights", jnp.ones(batch["input_ids"].shape[:1]))
  return {"lm_loss_sum": jnp.sum(nll_BL * w_BL),
          "lm_correct_sum": jnp.sum((jnp.argmax(logits_BLV, -1) == targets_BL) * w_BL),
          "lm_weight": jnp.sum(w_BL), "num_examples": jnp.sum(ex_w.astype(jnp.float32)),
          "num_tokens": jnp.sum(batch["input_mask"].astype(jnp.float32))}


def _summarize_ltr(sums: Mapping[str, float]) -> dict[str, float]:
  w = max(sums["lm_weight"], 1e-8)
  loss = sums["lm_loss_sum"] / w
  return {"loss": loss, "lm_loss": loss, "lm_accuracy": sums["lm_correct_sum"] / w}


def _ltr_flops(model, shapes: Mapping[str, tuple[int, ...]]) -> float:
  batch, length = shapes["input_ids"]  # the vocabulary projection at every position
  return flops_lib.train_flops_per_step(model.config, batch, length, length, nsp=False)


def ltr() -> Objective:
  """A left-to-right LM (model.BertForCausalLM): every real token predicts the next one,
  on the pre-training stream's text (the pipeline's masks undone: `restore_text`)."""
  return Objective(
      inputs=features.TEXT, sums=ltr_sums,
      denominators=lambda b: {"lm": jnp.maximum(jnp.sum(_next_token_weights(b)), 1e-8)},
      loss=lambda s, d: s["lm_loss_sum"] / d["lm"], summarize=_summarize_ltr,
      flops=_ltr_flops, console=(("lm_accuracy", "lm_acc"),),
      eval_console=(("lm_loss", "lm_loss"), ("lm_accuracy", "lm_acc")), count="num_examples",
      model_batch=restore_text)


# ------------------------------------------------- replaced-token detection ----

def electra_sums(outputs, batch) -> dict[str, jax.Array]:
  """The generator's masked-LM sums (pretraining_sums) and the discriminator's: sigmoid
  cross-entropy of "replaced" per real token, its accuracy, and how many were replaced."""
  sums = pretraining_sums({"mlm_logits": outputs["mlm_logits"]}, batch)
  z_BL = outputs["disc_logits"]
  y_BL = outputs["disc_labels"].astype(jnp.float32)
  w_BL = batch["input_mask"].astype(jnp.float32)
  nll_BL = jnp.maximum(z_BL, 0.0) - z_BL * y_BL + jnp.log1p(jnp.exp(-jnp.abs(z_BL)))
  sums.update(disc_loss_sum=jnp.sum(nll_BL * w_BL),
              disc_correct_sum=jnp.sum(((z_BL > 0) == (y_BL > 0)) * w_BL),
              disc_weight=jnp.sum(w_BL), replaced_sum=jnp.sum(y_BL * w_BL))
  return sums


def _electra_flops(model, shapes: Mapping[str, tuple[int, ...]]) -> float:
  """The generator's masked LM (the last layer at the masked rows only) + the discriminator
  over every token with its per-token head."""
  batch, length = shapes["input_ids"]
  preds = shapes["masked_lm_positions"][-1]
  gen = model.generator_config
  gen_flops = flops_lib.train_flops_per_step(gen, batch, length, preds, nsp=False,
                                             last_rows=preds if preds < length else None)
  d = model.config.hidden_size
  head = 3 * batch * length * (2 * d * d + 2 * d)
  return gen_flops + flops_lib.train_flops_per_step(model.config, batch, length, 0,
                                                    nsp=False) + head


def electra(discriminator_weight: float = 50.0) -> Objective:
  """ELECTRA's replaced-token detection (electra.ElectraPretraining): the generator's
  masked-LM loss (per masked token) + `discriminator_weight` x the discriminator's (per
  real token), the paper's lambda = 50."""
  def loss(sums, d):
    return (sums["mlm_loss_sum"] / d["mlm"]
            + discriminator_weight * sums["disc_loss_sum"] / d["disc"])

  def summarize(sums):
    out = summarize_pretraining(sums)
    w = max(sums["disc_weight"], 1e-8)
    out.update(disc_loss=sums["disc_loss_sum"] / w, disc_accuracy=sums["disc_correct_sum"] / w,
               replaced_fraction=sums["replaced_sum"] / w)
    out["loss"] = out["mlm_loss"] + discriminator_weight * out["disc_loss"]
    return out

  def denominators(batch):
    return {"mlm": jnp.maximum(jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)), 1e-8),
            "disc": jnp.maximum(jnp.sum(batch["input_mask"].astype(jnp.float32)), 1e-8)}

  return Objective(
      inputs=features.PRETRAINING + features.MLM_TARGETS, sums=electra_sums,
      denominators=denominators, loss=loss, summarize=summarize, flops=_electra_flops,
      console=(("mlm_accuracy", "gen_acc"), ("disc_accuracy", "disc_acc")),
      eval_console=(("mlm_loss", "gen_loss"), ("mlm_accuracy", "gen_acc"),
                    ("disc_loss", "disc_loss"), ("disc_accuracy", "disc_acc"),
                    ("replaced_fraction", "replaced")),
      count="num_examples", rng_streams=("sample",))


# ------------------------------------------------------------ fine-tuning ----

def _supervised_flops(model, shapes: Mapping[str, tuple[int, ...]]) -> float:
  *rows, length = shapes["input_ids"]  # [B, L], or [B, choices, L] (multiple choice)
  return flops_lib.train_flops_per_step(model.config, math.prod(rows), length, 0, nsp=False)


def rows_flops(rows: int) -> Callable:
  """Objective.flops for packed batches of `rows` rows (what the step computes, whatever
  the examples a batch holds)."""
  return lambda model, shapes: _supervised_flops(model, {"input_ids": (rows, shapes["input_ids"][-1])})


def supervised(sums_fn: Callable, weight_key: str = "example_weights",
               inputs: tuple[str, ...] = features.TEXT) -> Objective:
  """A fine-tuning head's sums (heads.classification_sums, span_sums, token_sums): `sums_fn(
  *outputs, batch) -> {"loss_sum", "correct_sum", "weight"}`, normalised by the global
  batch's `weight_key` sum (or its row count when the batch has no weights)."""
  def sums(outputs, batch):
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return sums_fn(*outputs, batch)

  def denominators(batch):
    if weight_key in batch:
      return {"weight": jnp.sum(batch[weight_key].astype(jnp.float32))}
    return {"weight": jnp.float32(batch["input_ids"].shape[0])}

  def summarize(host_sums):
    w = max(host_sums["weight"], 1e-8)
    return {"loss": host_sums["loss_sum"] / w, "accuracy": host_sums["correct_sum"] / w}

  return Objective(inputs=inputs, sums=sums, denominators=denominators,
                   loss=lambda s, d: s["loss_sum"] / jnp.maximum(d["weight"], 1e-8),
                   summarize=summarize, flops=_supervised_flops,
                   console=(("accuracy", "train_acc"),),
                   eval_console=(("accuracy", "accuracy"),), count="weight")
