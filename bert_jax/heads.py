"""Fine-tuning heads: a small new output layer on the (pre-trained) encoder.

Every model holds the encoder under `bert` (so `loader.load_into(..., target="encoder")` drops
a pre-trained one in) and its new layer under `classifier`. The encoder is the config's
family's (`encoder`): BERT's, or the modern encoders' (bert_jax/models/modern.py), whose pooled
output and token features (`tokens`) are their own heads' (ModernBERT's prediction head).
Axis legend as in model.py; C = classes (or choices).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import families
from bert_jax.models.bert import dense
from bert_jax.models.layers import ModelConfig
from common import errors


def encoder(cfg: Any, **kwargs) -> nn.Module:
  """The encoder module of the config's family (named `bert` in every model tree)."""
  return families.of(cfg).encoder(cfg, name="bert", **kwargs)


# What a feature-based head reads (the paper's Table 7), from the hidden states
# [embeddings, layer 1, ..., layer N]; "weighted" sums are learned softmax weights.
FEATURES = ("last", "embeddings", "second_to_last", "sum_last4", "concat_last4", "sum_all")
FEATURE_LAYERS = {"last": 1, "embeddings": 0, "second_to_last": 2, "sum_last4": 4,
                  "concat_last4": 4, "sum_all": 1}  # the encoder layers each needs at least
_STATES = {"last": slice(-1, None), "embeddings": slice(0, 1), "second_to_last": slice(-2, -1),
           "sum_last4": slice(-4, None), "concat_last4": slice(-4, None), "sum_all": slice(1, None)}
# The batch key of encoder features computed once per example (config.cache_features).
CACHED = "encoder_features"


def select_states(features: str, hidden: list[jax.Array]) -> jax.Array:
  """The hidden states `features` reads, stacked: [B, L, k, D]."""
  return jnp.stack(hidden[_STATES[features]], axis=2)


@dataclasses.dataclass(frozen=True)
class FeatureBased:
  """How a head reads the encoder (the paper's Table 7; every task's head takes one).

  `features`: which hidden states (FEATURES; "last" is what fine-tuning reads); `freeze`:
  no gradient reaches the encoder (its parameters never change; the optimizer keeps no state
  for them, optim.make_optimizer); `bilstm_units` > 0: `bilstm_layers` bidirectional LSTMs
  read the features before the head's classifier (the paper: two layers of 768)."""
  features: str = "last"
  freeze: bool = False
  bilstm_units: int = 0
  bilstm_layers: int = 1

  @classmethod
  def of(cls, config: Mapping[str, Any]) -> "FeatureBased":
    """From a task config (a ConfigDict, or the dict a run saved in best/config.json)."""
    return cls(config.get("features", "last"), bool(config.get("freeze_encoder", False)),
               int(config.get("bilstm_units", 0) or 0), int(config.get("bilstm_layers", 1)))

  @property
  def plain(self) -> bool:
    """Fine-tuning as the paper's main results: the last layer, every parameter trained."""
    return self.features == "last" and not self.freeze and not self.bilstm_units


class LayerFeatures(nn.Module):
  """The states `features` reads (select_states: [B, L, k, D]) combined: the one state
  ([B, L, D]), their softmax-weighted sum (weights `layer_weights`, equal at initialisation),
  or the concatenation of the last four ([B, L, 4D])."""
  features: str
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, states_BLKD: jax.Array) -> jax.Array:
    k = states_BLKD.shape[2]
    if self.features == "concat_last4":
      return states_BLKD.reshape(states_BLKD.shape[:2] + (k * states_BLKD.shape[3],))
    if self.features not in ("sum_last4", "sum_all"):
      return states_BLKD[:, :, 0]
    weights = self.param("layer_weights", nn.initializers.zeros_init(), (k,), self.param_dtype)
    w = jax.nn.softmax(weights.astype(jnp.float32)).astype(states_BLKD.dtype)
    return sum(w[i] * states_BLKD[:, :, i] for i in range(k))


class BiLSTM(nn.Module):
  """A bidirectional LSTM over [B, L, D] (padding after each row's `lengths`): [B, L, 2U]."""
  units: int
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_BLD, lengths_B):
    lstm = lambda: nn.RNN(nn.OptimizedLSTMCell(self.units, param_dtype=self.param_dtype))
    return nn.Bidirectional(lstm(), lstm())(x_BLD, seq_lengths=lengths_B)


def encoder_features(bert: nn.Module, how: FeatureBased, input_ids, segment_ids, input_mask,
                     deterministic: bool, sentence: bool) -> jax.Array:
  """All the encoder gives a feature-based head (with `how.freeze`, what config.cache_features
  computes once per example): the pooled output [B, D] (a sentence head reading "last"
  without a BiLSTM), the token output [B, L, D] ("last": what a token head reads when
  fine-tuning, `bert.tokens`), or the hidden states `how.features` combines [B, L, k, D]."""
  if how.features == "last":
    seq_BLD, pooled_BD = bert(input_ids, segment_ids, input_mask, deterministic)
    out = pooled_BD if sentence and not how.bilstm_units else bert.tokens(seq_BLD)
  else:
    cfg = bert.config
    if cfg.num_layers < FEATURE_LAYERS[how.features]:
      raise errors.ConfigError(
          f"--config.features={how.features} reads {FEATURE_LAYERS[how.features]} encoder "
          f"layers; this checkpoint has {cfg.num_layers}.")
    out = select_states(how.features, bert.hidden_states(input_ids, segment_ids, input_mask,
                                                         deterministic))
  return jax.lax.stop_gradient(out) if how.freeze else out


def _features(bert, how, input_ids, segment_ids, input_mask, deterministic, sentence, cached):
  """encoder_features, or the cached ones (the encoder then not run)."""
  if cached is not None:
    return cached
  return encoder_features(bert, how, input_ids, segment_ids, input_mask, deterministic, sentence)


def feature_sequence(enc, how: FeatureBased, input_mask, param_dtype,
                     first_bilstm: str = "bilstm_0") -> jax.Array:
  """[B, L, D'] per token from encoder_features: the layers combined (LayerFeatures, module
  `features`) and read by the BiLSTMs (`bilstm_{i}`); called inside a head's compact method."""
  seq_BLD = enc if how.features == "last" else LayerFeatures(how.features, param_dtype,
                                                             name="features")(enc)
  lengths_B = jnp.sum(input_mask, -1).astype(jnp.int32)
  for i in range(how.bilstm_layers if how.bilstm_units else 0):
    seq_BLD = BiLSTM(how.bilstm_units, param_dtype,
                     name=first_bilstm if i == 0 else f"bilstm_{i}")(seq_BLD, lengths_B)
  return seq_BLD


def feature_pooled(enc, how: FeatureBased, input_mask, param_dtype) -> jax.Array:
  """[B, D'] per sequence for a feature-based sentence head: the family's pooled output
  for "last" without a BiLSTM; else the [CLS] token's features, or with a BiLSTM its final
  states both ways (forward at the last real token, backward at [CLS])."""
  if how.features == "last" and not how.bilstm_units:
    return enc
  seq_BLD = feature_sequence(enc, how, input_mask, param_dtype)
  if not how.bilstm_units:
    return seq_BLD[:, 0]
  last_B = jnp.maximum(jnp.sum(input_mask, -1).astype(jnp.int32) - 1, 0)
  forward_BU = jnp.take_along_axis(seq_BLD[..., :how.bilstm_units], last_B[:, None, None], 1)[:, 0]
  return jnp.concatenate([forward_BU, seq_BLD[:, 0, how.bilstm_units:]], -1)


class BertForSequenceClassification(nn.Module):
  """Softmax (or, with num_labels=1, regression) on the pooled [CLS] output.

  Packed rows (several examples in one row, see input_pipeline/packing.py) pass
  `position_ids` and `packed_example_ids` [B, L] and `cls_positions` [B, E]:
  the logits are then [B, E, C], one per example slot (empty slots carry
  example_weights 0 in the loss). Feature-based (`how`, unpacked rows): feature_pooled.
  """
  config: ModelConfig
  num_labels: int
  how: FeatureBased = FeatureBased()

  @nn.compact
  def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True,
               position_ids=None, packed_example_ids=None, cls_positions=None,
               encoder_features=None):
    if self.how.plain:
      _, pooled = encoder(self.config, pooled_only=True)(
          input_ids, segment_ids, input_mask, deterministic, position_ids=position_ids,
          packed_example_ids=packed_example_ids, cls_positions=cls_positions)  # [B, (E,) D]
    else:
      enc = _features(encoder(self.config), self.how, input_ids, segment_ids, input_mask,
                      deterministic, True, encoder_features)
      pooled = feature_pooled(enc, self.how, input_mask, self.config.param_dtype)
    pooled = nn.Dropout(self.config.hidden_dropout_rate)(pooled, deterministic=deterministic)
    logits = dense(self.config, self.num_labels, ("embed", None), "classifier")(pooled)
    return logits.astype(jnp.float32)  # [B, C] or [B, E, C]


class BertForQuestionAnswering(nn.Module):
  """Start/end span logits at every token: [B, L] each. With `bilstm_units` (or `how`'s), a
  randomly initialised bidirectional LSTM (that many units each way) reads the encoder's
  output before the span classifier (the paper's Table 5 "+ BiLSTM", for the left-to-right
  model); `how` also makes it feature-based (feature_sequence)."""
  config: ModelConfig
  bilstm_units: int = 0
  how: FeatureBased = FeatureBased()

  @nn.compact
  def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True,
               encoder_features=None):
    how = self.how
    if self.bilstm_units:
      how = dataclasses.replace(how, bilstm_units=self.bilstm_units)
    enc = _features(encoder(self.config), how, input_ids, segment_ids, input_mask,
                    deterministic, False, encoder_features)
    # (a one-layer BiLSTM keeps the name "bilstm" that Table 5's checkpoints carry)
    seq_BLD = feature_sequence(enc, how, input_mask, self.config.param_dtype,
                               first_bilstm="bilstm" if how.bilstm_layers == 1 else "bilstm_0")
    logits_BL2 = dense(self.config, 2, ("embed", None), "classifier")(seq_BLD).astype(jnp.float32)
    return logits_BL2[..., 0], logits_BL2[..., 1]


class BertForTokenClassification(nn.Module):
  """A classifier on every token's final hidden state: [B, L, C]; feature-based as `how`
  says (feature_sequence: the paper's Table 7)."""
  config: ModelConfig
  num_labels: int
  how: FeatureBased = FeatureBased()

  @nn.compact
  def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True,
               encoder_features=None):
    cfg = self.config
    enc = _features(encoder(cfg), self.how, input_ids, segment_ids, input_mask, deterministic,
                    False, encoder_features)
    seq_BLD = feature_sequence(enc, self.how, input_mask, cfg.param_dtype)
    seq_BLD = nn.Dropout(cfg.hidden_dropout_rate)(seq_BLD, deterministic=deterministic)
    return dense(cfg, self.num_labels, ("embed", None), "classifier")(seq_BLD).astype(jnp.float32)


class BertForMultipleChoice(nn.Module):
  """Inputs [B, C, L]: each (context, choice) encoded, one score per [CLS]: [B, C];
  feature-based as `how` says (feature_pooled)."""
  config: ModelConfig
  how: FeatureBased = FeatureBased()

  @nn.compact
  def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True,
               encoder_features=None):
    batch, choices, length = input_ids.shape
    flat = lambda x: x.reshape(batch * choices, length)
    if self.how.plain:
      _, pooled_ND = encoder(self.config, pooled_only=True)(
          flat(input_ids), flat(segment_ids), flat(input_mask), deterministic)
    else:
      if encoder_features is not None:  # [B, C, ...] per example: [B * C, ...]
        encoder_features = encoder_features.reshape((batch * choices,) + encoder_features.shape[2:])
      enc = _features(encoder(self.config), self.how, flat(input_ids), flat(segment_ids),
                      flat(input_mask), deterministic, True, encoder_features)
      pooled_ND = feature_pooled(enc, self.how, flat(input_mask), self.config.param_dtype)
    pooled_ND = nn.Dropout(self.config.hidden_dropout_rate)(pooled_ND, deterministic=deterministic)
    scores_N1 = dense(self.config, 1, ("embed", None), "classifier")(pooled_ND)
    return scores_N1.reshape(batch, choices).astype(jnp.float32)


def cached_features(model: nn.Module, encoder_params, input_ids, segment_ids,
                    input_mask) -> jax.Array:
  """encoder_features for `model` (a head above) without dropout: what config.cache_features
  keeps per training example and passes back as the head's `encoder_features` ([B, ...];
  multiple choice [B, C, ...])."""
  sentence = not isinstance(model, (BertForQuestionAnswering, BertForTokenClassification))
  shape = input_ids.shape
  flat = lambda x: x.reshape(-1, shape[-1])
  out = nn.apply(lambda bert, *a: encoder_features(bert, model.how, *a, True, sentence),
                 encoder(model.config))({"params": encoder_params}, flat(input_ids),
                                        flat(segment_ids), flat(input_mask))
  return out.reshape(shape[:-1] + out.shape[1:])


def _nll(logits, labels):
  return -jnp.take_along_axis(jax.nn.log_softmax(logits, -1), labels[..., None], -1)[..., 0]


def classification_sums(logits: jax.Array, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
  """Sums of the cross-entropy, or of the squared error when there is one output (STS-B).

  logits [B, C] with labels / example_weights [B], or packed rows: logits
  [R, E, C] with labels / example_weights [R, E] (flattened to R*E examples;
  empty slots weigh 0). Sums and the weight therefore count examples, not rows.
  """
  logits_BC = logits.reshape(-1, logits.shape[-1])
  w_B = batch.get("example_weights", jnp.ones(logits_BC.shape[:1])).reshape(-1).astype(jnp.float32)
  labels_B = batch["labels"].reshape(-1)
  if logits_BC.shape[-1] == 1:
    per_example = jnp.square(logits_BC[:, 0] - labels_B.astype(jnp.float32))
    correct = jnp.zeros_like(per_example)
  else:
    labels = labels_B.astype(jnp.int32)
    per_example = _nll(logits_BC, labels)
    correct = (jnp.argmax(logits_BC, -1) == labels).astype(jnp.float32)
  return _weighted(per_example, correct, w_B)


def span_sums(start_BL, end_BL, batch) -> dict[str, jax.Array]:
  """Sums of the mean of start and end cross-entropies (as in the original run_squad.py)."""
  w_B = batch.get("example_weights", jnp.ones(start_BL.shape[:1])).astype(jnp.float32)
  starts, ends = batch["start_positions"].astype(jnp.int32), batch["end_positions"].astype(jnp.int32)
  per_example = 0.5 * (_nll(start_BL, starts) + _nll(end_BL, ends))
  correct = ((jnp.argmax(start_BL, -1) == starts) & (jnp.argmax(end_BL, -1) == ends)).astype(jnp.float32)
  return _weighted(per_example, correct, w_B)


def token_sums(logits_BLC, batch) -> dict[str, jax.Array]:
  """Sums of the cross-entropy over labelled tokens (first WordPiece of each word)."""
  labels = batch["labels"].astype(jnp.int32)
  w_BL = batch["label_weights"].astype(jnp.float32)
  per_token = _nll(logits_BLC, labels)
  correct = (jnp.argmax(logits_BLC, -1) == labels).astype(jnp.float32)
  return _weighted(per_token, correct, w_BL)


def _weighted(per_item, correct, weights) -> dict[str, jax.Array]:
  """The sums objectives.supervised divides: weighted loss and correct counts, and the weight."""
  return {"loss_sum": jnp.sum(per_item * weights), "correct_sum": jnp.sum(correct * weights),
          "weight": jnp.sum(weights)}
