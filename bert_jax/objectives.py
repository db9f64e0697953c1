"""Objectives: what a train step optimises and what the logs show, in one place each.

An `Objective` names the model inputs, computes metric *sums* of a (micro-)batch and the
denominators over the global batch, combines them into the loss, and turns host-side sums
into the scalars of the console and TensorBoard (`summarize`, `console`). The trainer and
its logging read whatever the objective returns, so a new objective (span masking,
ELECTRA, a new task) is one factory here plus the job that picks it.

  pretraining()          masked LM, plus NSP when the model has the NSP head
  supervised(loss_fn)    a fine-tuning head's loss (heads.*_loss): classification,
                         regression, span QA, tagging, multiple choice

Packed rows (input_pipeline/packing.py) carry PACKED_INPUTS; an objective passes those the
batch has to the model by keyword, so packed and unpacked batches share one objective.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from flax import struct
import jax
import jax.numpy as jnp

from input_pipeline import features

TEXT_INPUTS = features.TEXT
PRETRAINING_INPUTS = features.PRETRAINING
# Packed rows also carry these, passed to the model by keyword (see bert_jax.model.BertModel).
PACKED_INPUTS = features.PACKED


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
  console: tuple[tuple[str, str], ...] = struct.field(pytree_node=False, default=())
  eval_console: tuple[tuple[str, str], ...] = struct.field(pytree_node=False, default=())
  count: str = struct.field(pytree_node=False, default="")
  keyword_inputs: tuple[str, ...] = struct.field(pytree_node=False, default=PACKED_INPUTS)

  def apply(self, model, params, batch, **kwargs):
    """model.apply on the objective's inputs of `batch`."""
    return model.apply({"params": params}, *(batch[k] for k in self.inputs),
                       **{k: batch[k] for k in self.keyword_inputs if k in batch}, **kwargs)


# ----------------------------------------------------------- pre-training ----

def pretraining_loss(outputs: Mapping[str, jax.Array], batch: Mapping[str, jax.Array]
                     ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Weighted-mean masked-LM cross-entropy + mean NSP cross-entropy (when the outputs
  hold "nsp_logits"; the masked-LM loss alone otherwise).

  Returns the scalar loss and metric *sums* with their denominators, so metrics
  can be summed over steps/devices and divided once on the host.
  """
  logits_BPV = outputs["mlm_logits"]
  ids_BP = batch["masked_lm_ids"].astype(jnp.int32)
  w_BP = batch["masked_lm_weights"].astype(jnp.float32)
  logp_BPV = jax.nn.log_softmax(logits_BPV, axis=-1)
  mlm_nll_BP = -jnp.take_along_axis(logp_BPV, ids_BP[..., None], axis=-1)[..., 0]
  mlm_weight = jnp.sum(w_BP)
  mlm_loss_sum = jnp.sum(mlm_nll_BP * w_BP)
  mlm_loss = mlm_loss_sum / jnp.maximum(mlm_weight, 1e-8)
  metrics = {
      "mlm_loss_sum": mlm_loss_sum,
      "mlm_correct_sum": jnp.sum((jnp.argmax(logits_BPV, -1) == ids_BP) * w_BP),
      "mlm_weight": mlm_weight,
  }
  # Examples may carry a weight (0 for padding rows of a ragged final batch, or
  # for empty example slots of a packed row).
  labels = batch["next_sentence_labels"]
  ex_w_B = batch.get("next_sentence_weights", batch.get("example_weights", jnp.ones(labels.shape)))
  ex_w_B = ex_w_B.reshape(-1).astype(jnp.float32)
  metrics["num_examples"] = jnp.sum(ex_w_B)
  if "nsp_logits" not in outputs:
    return mlm_loss, metrics

  # [B, 2], or [B, E, 2] for packed rows (E examples a row): flatten to examples.
  nsp_logits_B2 = outputs["nsp_logits"].reshape(-1, 2)
  labels_B = labels.reshape(-1).astype(jnp.int32)
  nsp_nll_B = -jnp.take_along_axis(jax.nn.log_softmax(nsp_logits_B2), labels_B[:, None], axis=-1)[:, 0]
  nsp_loss_sum = jnp.sum(nsp_nll_B * ex_w_B)
  nsp_loss = nsp_loss_sum / jnp.maximum(metrics["num_examples"], 1e-8)
  metrics["nsp_loss_sum"] = nsp_loss_sum
  metrics["nsp_correct_sum"] = jnp.sum((jnp.argmax(nsp_logits_B2, -1) == labels_B) * ex_w_B)
  return mlm_loss + nsp_loss, metrics


def _pretraining_sums(outputs, batch):
  # Real (non-padding) tokens: throughput that packing is measured by.
  num_tokens = jnp.sum(batch["input_mask"].astype(jnp.float32))
  return dict(pretraining_loss(outputs, batch)[1], num_tokens=num_tokens)


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
  out["loss"] = out["mlm_loss"]
  if "nsp_loss_sum" in sums:
    n = max(sums["num_examples"], 1e-8)
    out["nsp_loss"] = sums["nsp_loss_sum"] / n
    out["nsp_accuracy"] = sums["nsp_correct_sum"] / n
    out["loss"] += out["nsp_loss"]
  return out


def pretraining() -> Objective:
  """Masked LM + NSP, or masked LM alone for BertForPreTraining(nsp=False): the model's
  outputs (and so the sums) say which; packed rows (data.packing) need nothing more."""
  return Objective(
      inputs=PRETRAINING_INPUTS, sums=_pretraining_sums, denominators=_pretraining_denominators,
      loss=_pretraining_loss, summarize=summarize_pretraining,
      console=(("mlm_accuracy", "mlm_acc"), ("nsp_accuracy", "nsp_acc")),
      eval_console=(("mlm_loss", "mlm_loss"), ("mlm_accuracy", "mlm_acc"),
                    ("nsp_loss", "nsp_loss"), ("nsp_accuracy", "nsp_acc")),
      count="num_examples")


# ------------------------------------------------------------ fine-tuning ----

def supervised(loss_fn: Callable, weight_key: str = "example_weights",
               inputs: tuple[str, ...] = TEXT_INPUTS) -> Objective:
  """A fine-tuning head's loss (heads.classification_loss, span_loss, token_loss): `loss_fn(
  *outputs, batch) -> (loss, {"loss_sum", "correct_sum", "weight"})`, normalised by the
  global batch's `weight_key` sum (or its row count when the batch has no weights)."""
  def sums(outputs, batch):
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return loss_fn(*outputs, batch)[1]

  def denominators(batch):
    if weight_key in batch:
      return {"weight": jnp.sum(batch[weight_key].astype(jnp.float32))}
    return {"weight": jnp.float32(batch["input_ids"].shape[0])}

  def summarize(host_sums):
    w = max(host_sums["weight"], 1e-8)
    return {"loss": host_sums["loss_sum"] / w, "accuracy": host_sums["correct_sum"] / w}

  return Objective(inputs=inputs, sums=sums, denominators=denominators,
                   loss=lambda s, d: s["loss_sum"] / jnp.maximum(d["weight"], 1e-8),
                   summarize=summarize, console=(("accuracy", "train_acc"),),
                   eval_console=(("accuracy", "accuracy"),), count="weight")
