"""Fine-tuning heads: a small new output layer on the (pre-trained) encoder.

Every model holds the encoder under `bert` (so `convert.load_pretrained(...,
target="encoder")` drops in) and its new layer under `classifier`.
Axis legend as in model.py; C = classes (or choices).
"""
from __future__ import annotations

from typing import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model import BertConfig, BertModel, _dense


class BertForSequenceClassification(nn.Module):
  """Softmax (or, with num_labels=1, regression) on the pooled [CLS] output."""
  config: BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True):
    _, pooled_BD = BertModel(self.config, name="bert")(input_ids, segment_ids, input_mask, deterministic)
    pooled_BD = nn.Dropout(self.config.hidden_dropout_rate)(pooled_BD, deterministic=deterministic)
    logits_BC = _dense(self.config, self.num_labels, ("embed", None), "classifier")(pooled_BD)
    return logits_BC.astype(jnp.float32)


class BertForQuestionAnswering(nn.Module):
  """Start/end span logits at every token: [B, L] each."""
  config: BertConfig

  @nn.compact
  def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True):
    seq_BLD, _ = BertModel(self.config, name="bert")(input_ids, segment_ids, input_mask, deterministic)
    logits_BL2 = _dense(self.config, 2, ("embed", None), "classifier")(seq_BLD).astype(jnp.float32)
    return logits_BL2[..., 0], logits_BL2[..., 1]


class BertForTokenClassification(nn.Module):
  """A classifier on every token's final hidden state: [B, L, C]."""
  config: BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True):
    seq_BLD, _ = BertModel(self.config, name="bert")(input_ids, segment_ids, input_mask, deterministic)
    seq_BLD = nn.Dropout(self.config.hidden_dropout_rate)(seq_BLD, deterministic=deterministic)
    return _dense(self.config, self.num_labels, ("embed", None), "classifier")(seq_BLD).astype(jnp.float32)


class BertForMultipleChoice(nn.Module):
  """Inputs [B, C, L]: each (context, choice) encoded, one score per [CLS]: [B, C]."""
  config: BertConfig

  @nn.compact
  def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True):
    batch, choices, length = input_ids.shape
    flat = lambda x: x.reshape(batch * choices, length)
    _, pooled_ND = BertModel(self.config, name="bert")(
        flat(input_ids), flat(segment_ids), flat(input_mask), deterministic)
    pooled_ND = nn.Dropout(self.config.hidden_dropout_rate)(pooled_ND, deterministic=deterministic)
    scores_N1 = _dense(self.config, 1, ("embed", None), "classifier")(pooled_ND)
    return scores_N1.reshape(batch, choices).astype(jnp.float32)


def _nll(logits, labels):
  return -jnp.take_along_axis(jax.nn.log_softmax(logits, -1), labels[..., None], -1)[..., 0]


def classification_loss(logits_BC: jax.Array, batch: Mapping[str, jax.Array]):
  """Cross-entropy, or squared error when there is one output (STS-B)."""
  w_B = batch.get("example_weights", jnp.ones(logits_BC.shape[:1])).astype(jnp.float32)
  if logits_BC.shape[-1] == 1:
    per_example = jnp.square(logits_BC[:, 0] - batch["labels"].astype(jnp.float32))
    correct = jnp.zeros_like(per_example)
  else:
    labels = batch["labels"].astype(jnp.int32)
    per_example = _nll(logits_BC, labels)
    correct = (jnp.argmax(logits_BC, -1) == labels).astype(jnp.float32)
  return _weighted(per_example, correct, w_B)


def span_loss(start_BL, end_BL, batch):
  """Mean of start and end cross-entropies (as in the original run_squad.py)."""
  w_B = batch.get("example_weights", jnp.ones(start_BL.shape[:1])).astype(jnp.float32)
  starts, ends = batch["start_positions"].astype(jnp.int32), batch["end_positions"].astype(jnp.int32)
  per_example = 0.5 * (_nll(start_BL, starts) + _nll(end_BL, ends))
  correct = ((jnp.argmax(start_BL, -1) == starts) & (jnp.argmax(end_BL, -1) == ends)).astype(jnp.float32)
  return _weighted(per_example, correct, w_B)


def token_loss(logits_BLC, batch):
  """Cross-entropy over labelled tokens (first WordPiece of each word)."""
  labels = batch["labels"].astype(jnp.int32)
  w_BL = batch["label_weights"].astype(jnp.float32)
  per_token = _nll(logits_BLC, labels)
  correct = (jnp.argmax(logits_BLC, -1) == labels).astype(jnp.float32)
  return _weighted(per_token, correct, w_BL)


def _weighted(per_item, correct, weights):
  denom = jnp.sum(weights)
  loss_sum = jnp.sum(per_item * weights)
  metrics = {"loss_sum": loss_sum, "correct_sum": jnp.sum(correct * weights), "weight": denom}
  return loss_sum / jnp.maximum(denom, 1e-8), metrics
