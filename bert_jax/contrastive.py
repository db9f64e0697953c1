"""Contrastive fine-tuning of an encoder into an embedding model (config.task=embed).

The model embeds each row's anchor, positive and hard negatives with one encoder (one call on
all of them, row-major, so a device keeps its own rows) and pools them (bert_jax/embed.py).
The loss is InfoNCE with in-batch negatives (sentence-transformers' MultipleNegativesRanking
loss): each anchor's cosine similarity, times `scale`, to every positive and hard negative of
the batch, cross-entropy towards its own positive; `symmetric` adds the positives' loss over
the anchors. The similarity matrix is computed on the whole global batch: under jit on a mesh
the candidates of every data-parallel device are gathered, so the global batch is each
anchor's negative pool, whatever the number of devices.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import embed
from bert_jax import families
from bert_jax import flops as flops_lib
from bert_jax import objectives
from common import errors
from input_pipeline import features

INPUTS = features.TEXT  # positional; the rest by keyword:
NEGATIVES = ("negative_ids", "negative_mask")
# The batch's other texts (pairs' positives and hard negatives), or its texts packed into rows
# (input_pipeline/epochs.PackedPairBatches: the rows' position_ids and packed_example_ids,
# each pair's texts' (row, slot) in text_at).
KEYWORDS = ("positive_ids", "positive_mask") + NEGATIVES + (
    "position_ids", "packed_example_ids", "text_at")


class SentenceEncoder(nn.Module):
  """(anchors [B, D], candidates [B, 1 + K, D]: each row's positive, then its K hard
  negatives), pooled per `pooling`, in float32 and not normalised (the loss normalises).

  Packed rows (`text_at` given): the inputs are rows holding up to `texts_per_row` texts
  each, encoded with attention inside each text, pooled per text and gathered back into
  pairs: the same vectors as the texts encoded one a row, on fewer padding tokens.

  `chunk` > 0 (training only): the gradient cache. The rows are encoded `chunk` at a time
  in a loop whose body is rematerialised, so the forward pass keeps only the pooled vectors;
  the backward pass encodes each chunk again and sends it its vectors' gradient. The loss and
  the gradients are the plain batch's, at the activation memory of one chunk (Gao et al.,
  2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup")."""
  config: Any
  pooling: str = "mean"
  chunk: int = 0
  texts_per_row: int = 8  # packed rows' slots

  def setup(self):
    self.bert = families.of(self.config).encoder(self.config, add_pooler=False)

  def __call__(self, input_ids, segment_ids, input_mask, positive_ids=None, positive_mask=None,
               deterministic: bool = True, negative_ids=None, negative_mask=None,
               position_ids=None, packed_example_ids=None, text_at=None):
    del segment_ids  # one segment a text
    if text_at is not None:  # packed rows
      rows = {"ids": input_ids, "mask": input_mask, "position_ids": position_ids,
              "packed_example_ids": packed_example_ids}
      pooled_RED = self._encode(rows, deterministic)
      pooled = pooled_RED[text_at[..., 0], text_at[..., 1]]  # [B, T, D]
      return pooled[:, 0], pooled[:, 1:]
    texts = [input_ids[:, None]] + ([positive_ids[:, None]] if positive_ids is not None else [])
    masks = [input_mask[:, None]] + ([positive_mask[:, None]] if positive_mask is not None else [])
    if negative_ids is not None:
      texts.append(negative_ids)
      masks.append(negative_mask)
    ids_BTL, mask_BTL = jnp.concatenate(texts, 1), jnp.concatenate(masks, 1)
    B, T, L = ids_BTL.shape
    pooled = self._encode({"ids": ids_BTL.reshape(B * T, L), "mask": mask_BTL.reshape(B * T, L)},
                          deterministic).reshape(B, T, -1)
    return pooled[:, 0], pooled[:, 1:]

  def _encode(self, rows, deterministic):
    """Pooled vectors of rows {ids, mask[, position_ids, packed_example_ids]} [N, L]: [N, D],
    or [N, texts_per_row, D] for packed rows."""
    n = rows["ids"].shape[0]
    if self.chunk and not deterministic and not self.is_initializing() and n > self.chunk:
      return self._chunked(rows)
    return _encode_rows(self.bert, self.pooling, self.texts_per_row, rows, deterministic)

  def _chunked(self, rows):
    n, c = rows["ids"].shape[0] // self.chunk, self.chunk
    if n * c != rows["ids"].shape[0]:
      what = ("packed rows" if "packed_example_ids" in rows else
              "texts (rows x (2 + hard negatives))")
      raise errors.ConfigError(
          f"--config.grad_cache_chunk={c} does not divide the {rows['ids'].shape[0]} {what} "
          "of a batch: choose a divisor.")
    params = self.bert.variables["params"]
    rng = self.make_rng("dropout")
    encoder, pooling, per_row = self.bert.clone(parent=None), self.pooling, self.texts_per_row
    # Chunk j holds rows j, n + j, 2n + j, ...: a data-parallel device keeps its own rows.
    chunked = {k: v.reshape((c, n) + v.shape[1:]).swapaxes(0, 1) for k, v in rows.items()}

    @jax.checkpoint
    def body(p, x):
      j, chunk_rows = x
      return _encode_rows(encoder.bind({"params": p}, rngs={"dropout": jax.random.fold_in(rng, j)}),
                          pooling, per_row, chunk_rows, False)

    pooled_nC = jax.lax.map(lambda x: body(params, x), (jnp.arange(n), chunked))
    return pooled_nC.swapaxes(0, 1).reshape((n * c,) + pooled_nC.shape[2:])


def _encode_rows(encoder, pooling: str, texts_per_row: int, rows, deterministic):
  """`encoder` (bound) on rows [N, L] -> pooled [N, D] (one text a row) or [N, E, D] (packed)."""
  ids, mask = rows["ids"], rows["mask"]
  if "packed_example_ids" not in rows:
    seq, _ = encoder(ids, jnp.zeros_like(ids), mask, deterministic)
    return embed.pool(seq, mask, pooling)
  seq, _ = encoder(ids, jnp.zeros_like(ids), mask, deterministic,
                   position_ids=rows["position_ids"], packed_example_ids=rows["packed_example_ids"])
  return embed.pool_packed(seq, rows["packed_example_ids"], rows["position_ids"], texts_per_row,
                           pooling)


_MASKED = -1e9  # the score of a padding row's candidates (finite: no inf - inf anywhere)


def _unit(x):
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _info_nce(a_BD, candidates_BCD, w_B, scale, symmetric):
  """(per-row loss, per-row "own positive ranks first") of one embedding width."""
  B, C, D = candidates_BCD.shape
  a_BD = _unit(a_BD)
  cand_ND = _unit(jnp.swapaxes(candidates_BCD, 0, 1).reshape(C * B, D))  # positives first
  valid_N = jnp.tile(w_B > 0, C)
  logits_BN = jnp.where(valid_N[None], scale * a_BD @ cand_ND.T, _MASKED)
  own_B = jnp.arange(B)
  loss_B = jax.nn.logsumexp(logits_BN, -1) - logits_BN[own_B, own_B]
  correct_B = (jnp.argmax(logits_BN, -1) == own_B).astype(jnp.float32)
  if symmetric:  # each positive towards its anchor, among the batch's anchors
    back_BB = jnp.where((w_B > 0)[None], scale * cand_ND[:B] @ a_BD.T, _MASKED)
    loss_B = 0.5 * (loss_B + jax.nn.logsumexp(back_BB, -1) - back_BB[own_B, own_B])
  return loss_B, correct_B


def info_nce_sums(anchors_BD, candidates_BCD, batch: Mapping[str, jax.Array], *, scale: float,
                  symmetric: bool, dims: tuple[int, ...] = ()) -> dict[str, jax.Array]:
  """Sums of the InfoNCE loss and of "the own positive ranks first" over the batch's rows;
  rows weighing 0 (evaluation padding) neither count nor serve as negatives. `dims`
  (Matryoshka): the loss is the sum of the losses of the vectors' first d components for
  each d (as sentence-transformers' MatryoshkaLoss), the ranking that of the first d."""
  w_B = batch.get("example_weights", jnp.ones(anchors_BD.shape[:1])).astype(jnp.float32)
  loss_B = correct_B = None
  for d in dims or (anchors_BD.shape[-1],):
    loss_d, correct_d = _info_nce(anchors_BD[:, :d], candidates_BCD[..., :d], w_B, scale,
                                  symmetric)
    loss_B = loss_d if loss_B is None else loss_B + loss_d
    correct_B = correct_d if correct_B is None else correct_B
  loss_B = jnp.where(w_B > 0, loss_B, 0.0)
  return {"loss_sum": jnp.sum(loss_B * w_B), "correct_sum": jnp.sum(correct_B * w_B),
          "weight": jnp.sum(w_B)}


def _flops(model, shapes: Mapping[str, tuple[int, ...]]) -> float:
  """The encoder's training FLOPs over every text of the batch (anchor, positive, negatives).
  Packed batches are counted by their rows instead (finetune sets objectives.rows_flops)."""
  B, L = shapes["input_ids"]
  texts = 2 + (shapes["negative_ids"][1] if "negative_ids" in shapes else 0)
  return flops_lib.train_flops_per_step(model.config, B * texts, L, 0, nsp=False)


def objective(scale: float, symmetric: bool, dims: tuple[int, ...] = ()) -> objectives.Objective:
  """objectives.supervised's sums and summaries over InfoNCE (train_acc: the share of anchors
  whose own positive ranks first in the batch)."""
  base = objectives.supervised(
      lambda a, c, batch: info_nce_sums(a, c, batch, scale=scale, symmetric=symmetric,
                                        dims=dims), "example_weights", inputs=INPUTS)
  return base.replace(keyword_inputs=KEYWORDS, flops=_flops)


def matryoshka_dims(text, hidden_size: int) -> tuple[int, ...]:
  """config.matryoshka_dims ("768,256,64" or a tuple; "" = off) -> the widths, largest first;
  one outside 1..hidden_size is a ConfigError."""
  items = text.split(",") if isinstance(text, str) else text
  try:
    dims = tuple(sorted({int(x) for x in items if str(x).strip()}, reverse=True))
  except ValueError:
    raise errors.ConfigError(f"--config.matryoshka_dims={text!r}: comma-separated widths, e.g. "
                             f"{hidden_size},256,64.") from None
  if any(not 0 < d <= hidden_size for d in dims):
    raise errors.ConfigError(f"--config.matryoshka_dims={text!r}: each width must lie in "
                             f"1..{hidden_size} (the model's hidden size).")
  return dims


def check_scale(scale: float) -> None:
  if not (scale > 0 and math.isfinite(scale)):
    raise errors.ConfigError(f"--config.scale={scale}: the similarity scale (1 / temperature) "
                             "must be positive, e.g. 20 (sentence-transformers' default).")
