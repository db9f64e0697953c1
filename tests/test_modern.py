"""The modern encoders (bert_jax/models/modern.py) against transformers in float32, on HuggingFace
directories built here with random weights: ModernBERT (global + sliding-window layers) and
EuroBERT (RMSNorm, SwiGLU, grouped-query attention): their attention kernels, packed rows,
pooling kinds and layouts. What every family shares is tests/test_conformance.py's."""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import modern
from bert_jax.models import modern_formats

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tests import hf_parity  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

V, L = 96, 40


def _hf_config(family: str, **kw):
  if family == "modernbert":
    return transformers.ModernBertConfig(**{**dict(
        vocab_size=V, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=96, local_attention=8, max_position_embeddings=128,
        pad_token_id=0, bos_token_id=1, cls_token_id=1, eos_token_id=2, sep_token_id=2,
        global_attn_every_n_layers=3, attn_implementation="eager"), **kw})
  return transformers.EuroBertConfig(**{**dict(
      vocab_size=V, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
      num_key_value_heads=2, intermediate_size=96, max_position_embeddings=128,
      pad_token_id=0, bos_token_id=1, eos_token_id=2, mask_token_id=3,
      attn_implementation="eager"), **kw})


def _hf_dir(tmp_path, family, arch, seed=0, **kw):
  cls = getattr(transformers, {"modernbert": "ModernBert", "eurobert": "EuroBert"}[family] + arch)
  return hf_parity.hf_dir(tmp_path, cls, _hf_config(family, **kw),
                          lambda name: "norm" in name, seed)


def _inputs(seed=0, batch=3, pad=(0, 7, 19)):
  return hf_parity.padded_inputs(seed, batch, pad, V, L, first_id=1, pad_id=0)


_torch = hf_parity.to_torch


@pytest.mark.parametrize("family", ["modernbert", "eurobert"])
@pytest.mark.parametrize("attention", ["banded", "dense", "splash", "flash"])
def test_hidden_states_and_mlm_logits_match_transformers(tmp_path, family, attention):
  path, hf = _hf_dir(tmp_path, family, "ForMaskedLM")
  cfg, params = modern_formats.read_hf(path, "pretraining")
  cfg = cfg.replace(attention=attention)
  ids, mask = _inputs()
  with torch.no_grad():
    out = hf(input_ids=_torch(ids), attention_mask=_torch(mask), output_hidden_states=True)
  want_h = out.hidden_states[-1].numpy()  # after the final norm
  enc = modern.ModernModel(cfg, add_pooler=False)
  got_h, _ = enc.apply({"params": params["bert"]}, ids, None, mask)
  real = mask.astype(bool)
  assert np.abs(np.asarray(got_h)[real] - want_h[real]).max() <= 1e-5
  positions = np.broadcast_to(np.arange(L, dtype=np.int32), ids.shape)
  got = modern.ModernForMaskedLM(cfg).apply({"params": params}, ids, None, mask, positions)
  got_logits = np.asarray(got["mlm_logits"])[real]
  want_logits = out.logits.numpy()[real]
  assert np.abs(got_logits - want_logits).max() <= 1e-4
  assert (got_logits.argmax(-1) == want_logits.argmax(-1)).all()


@pytest.mark.parametrize("family", ["modernbert", "eurobert"])
def test_predicts_features_of_every_layer_as_transformers_hidden_states(tmp_path, family):
  """predict --mode=features' layers are transformers' output_hidden_states[1:], the last
  after the final norm (its last_hidden_state), as feature-based fine-tuning reads them."""
  from bert_jax import predict  # pylint: disable=g-import-not-at-top
  path, hf = _hf_dir(tmp_path, family, "Model")
  cfg, params = modern_formats.read_hf(path, "encoder")
  ids, mask = _inputs()
  with torch.no_grad():
    want = hf(input_ids=_torch(ids), attention_mask=_torch(mask),
              output_hidden_states=True).hidden_states[1:]
  layers = list(range(-cfg.num_layers, 0))
  _, got = predict.feature_fn(cfg, {"bert": params}, layers)(ids, mask)
  real = mask.astype(bool)
  for i, w in enumerate(want):
    assert np.abs(np.asarray(got)[:, :, i][real] - w.numpy()[real]).max() <= 1e-5, i


def test_sliding_window_is_shorter_than_the_sequence():
  # The test above means something only if the local layers really see less than L.
  cfg = modern_formats.config_from_hf(_hf_config("modernbert").to_dict())
  assert cfg.local_window // 2 < L and modern.LOCAL in cfg.layer_types


@pytest.mark.parametrize("family", ["modernbert", "eurobert"])
@pytest.mark.parametrize("budget", [0.0, 0.8])  # global layers dense / 19 of 25 block pairs
def test_packed_rows_equal_each_example_alone(tmp_path, family, budget):
  path, hf = _hf_dir(tmp_path, family, "Model")
  cfg, params = modern_formats.read_hf(path, "encoder")
  cfg = cfg.replace(global_block_budget=budget, global_block=8)
  rng = np.random.default_rng(1)
  lengths = (15, 20)
  examples = [np.concatenate([[1], rng.integers(4, V, n - 1)]).astype(np.int32) for n in lengths]
  row = np.zeros((1, L), np.int32)
  seg = np.zeros((1, L), np.int32)
  pos = np.zeros((1, L), np.int32)
  start = 0
  for e, x in enumerate(examples):
    row[0, start:start + len(x)] = x
    seg[0, start:start + len(x)] = e + 1
    pos[0, start:start + len(x)] = np.arange(len(x))
    start += len(x)
  got, _ = modern.ModernModel(cfg, add_pooler=False).apply(
      {"params": params}, row, None, (seg > 0).astype(np.int32), position_ids=pos,
      packed_example_ids=seg)
  start = 0
  for x in examples:
    with torch.no_grad():
      want = hf(input_ids=_torch(x[None])).last_hidden_state.numpy()[0]
    assert np.abs(np.asarray(got)[0, start:start + len(x)] - want).max() <= 1e-5
    start += len(x)


@pytest.mark.parametrize("family,pooling", [("modernbert", "cls"), ("modernbert", "mean"),
                                            ("eurobert", "bos"), ("eurobert", "mean"),
                                            ("eurobert", "late")])
def test_sequence_classification_logits_match(tmp_path, family, pooling):
  path, hf = _hf_dir(tmp_path, family, "ForSequenceClassification", num_labels=3,
                     classifier_pooling=pooling)
  cfg, params = modern_formats.read_hf(path, "all")
  ids, mask = _inputs(2)
  with torch.no_grad():
    want = hf(input_ids=_torch(ids), attention_mask=_torch(mask)).logits.numpy()
  _, pooled = modern.ModernModel(cfg).apply({"params": params["bert"]}, ids, None, mask)
  k = params["classifier"]
  got = np.asarray(pooled) @ k["kernel"] + k["bias"]
  assert np.abs(got - want).max() <= 1e-4


def test_scanned_layers_equal_unrolled(tmp_path):
  path, _ = _hf_dir(tmp_path, "modernbert", "Model")
  cfg, params = modern_formats.read_hf(path, "encoder")
  ids, mask = _inputs(4)
  want, _ = modern.ModernModel(cfg, add_pooler=False).apply({"params": params}, ids, None, mask)
  layers = [params["encoder"][f"layer_{i}"] for i in range(cfg.num_layers)]
  scanned = {**params, "encoder": {"layers": jax.tree.map(lambda *x: np.stack(x), *layers)}}
  got, _ = modern.ModernModel(cfg.replace(scan_layers=True), add_pooler=False).apply(
      {"params": scanned}, ids, None, mask)
  assert np.abs(np.asarray(got) - np.asarray(want))[mask.astype(bool)].max() <= 1e-5


def test_banded_attention_is_exact_against_dense():
  rng = np.random.default_rng(0)
  b, l, h, g, k = 2, 37, 4, 2, 8
  q = jnp.asarray(rng.normal(size=(b, l, h, k)), jnp.float32)
  kk = jnp.asarray(rng.normal(size=(b, l, g, k)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(b, l, g, k)), jnp.float32)
  seg = np.ones((b, l), np.int32)
  seg[1, 20:] = 2
  seg[1, 33:] = 0
  for half in (1, 3, 5, 16, 64):
    want = modern.dense_attention(q, kk, v, seg, half, jnp.float32)
    got = modern.banded_attention(q, kk, v, seg, half, jnp.float32)
    real = seg > 0
    assert np.abs(np.asarray(got) - np.asarray(want))[real].max() <= 1e-6, half


def test_config_json_round_trip():
  for family in ("modernbert", "eurobert"):
    hf = _hf_config(family).to_dict()
    cfg = modern_formats.config_from_hf(hf)
    again = modern_formats.config_from_hf(json.loads(json.dumps(
        modern_formats.config_to_hf(cfg, "X"))))
    assert again == cfg


def test_splash_attention_is_exact_and_trains_the_same():
  """The Pallas splash kernel (interpreted on CPU) against the XLA reference: global and
  local layers, packed segments and padding, values and gradients."""
  rng = np.random.default_rng(1)
  b, l, h, g, k = 2, 200, 4, 2, 16
  q = jnp.asarray(rng.normal(size=(b, l, h, k)), jnp.float32)
  kk = jnp.asarray(rng.normal(size=(b, l, g, k)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(b, l, g, k)), jnp.float32)
  seg = np.ones((b, l), np.int32)
  seg[1, 90:] = 2
  seg[1, 170:] = 0
  real = seg > 0
  for half in (None, 8):
    fn = lambda f, q, kk, v: jnp.sum(jnp.where(real[..., None, None], f(
        q, kk, v, seg, half, jnp.float32), 0.0) ** 2)
    want, want_g = jax.value_and_grad(lambda *a: fn(modern.dense_attention, *a), (0, 1, 2))(q, kk, v)
    got, got_g = jax.value_and_grad(lambda *a: fn(modern.splash_attention, *a), (0, 1, 2))(q, kk, v)
    assert abs(float(got) - float(want)) <= 1e-4 * abs(float(want))
    for a, c in zip(got_g, want_g):
      assert np.abs(np.asarray(a) - np.asarray(c)).max() <= 1e-4, half


def test_packed_global_attention_is_exact_within_its_budget_and_falls_back():
  rng = np.random.default_rng(2)
  b, l, h, g, k = 2, 96, 4, 2, 8
  q = jnp.asarray(rng.normal(size=(b, l, h, k)), jnp.float32)
  kk = jnp.asarray(rng.normal(size=(b, l, g, k)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(b, l, g, k)), jnp.float32)
  seg = np.zeros((b, l), np.int32)
  for row, lengths in enumerate(((10, 20, 7, 30), (50, 40))):
    start = 0
    for e, n in enumerate(lengths):
      seg[row, start:start + n] = e + 1
      start += n
  real = seg > 0
  want = np.asarray(modern.dense_attention(q, kk, v, seg, None, jnp.float32))
  for budget in (0.5, 0.05):  # 0.05: fewer pairs than needed -> the dense path
    fn = jax.jit(lambda *a: modern.packed_global_attention(*a, seg, jnp.float32, 16, budget))
    got = np.asarray(fn(q, kk, v))
    assert np.abs(got - want)[real].max() <= 1e-5, budget
  loss = lambda f, *a: jnp.sum(jnp.where(real[..., None, None], f(*a), 0.0) ** 2)
  g1 = jax.grad(lambda *a: loss(lambda *x: modern.packed_global_attention(
      *x, seg, jnp.float32, 16, 0.5), *a), (0, 1, 2))(q, kk, v)
  g2 = jax.grad(lambda *a: loss(lambda *x: modern.dense_attention(
      *x, seg, None, jnp.float32), *a), (0, 1, 2))(q, kk, v)
  for a, c in zip(g1, g2):
    assert np.abs(np.asarray(a) - np.asarray(c)).max() <= 1e-4


@pytest.mark.parametrize("family", ["modernbert"])  # EuroBERT ships no QA / multiple-choice heads
def test_question_answering_and_multiple_choice_logits_match(tmp_path, family):
  from bert_jax import heads  # pylint: disable=g-import-not-at-top
  path, hf = _hf_dir(tmp_path, family, "ForQuestionAnswering", num_labels=2)
  cfg, params = modern_formats.read_hf(path, "all")
  ids, mask = _inputs(6)
  with torch.no_grad():
    out = hf(input_ids=_torch(ids), attention_mask=_torch(mask))
  start, end = heads.BertForQuestionAnswering(cfg).apply({"params": params}, ids, None, mask)
  real = mask.astype(bool)
  for got, want in ((start, out.start_logits), (end, out.end_logits)):
    assert np.abs(np.asarray(got)[real] - want.numpy()[real]).max() <= 1e-4
  path, hf = _hf_dir(tmp_path, family, "ForMultipleChoice", seed=1)
  cfg, params = modern_formats.read_hf(path, "all")
  ids, mask = _inputs(7, batch=3)
  choices = lambda x: np.stack([x, np.roll(x, 1, 0)], 1)  # [B, 2, L]
  with torch.no_grad():
    want = hf(input_ids=_torch(choices(ids)), attention_mask=_torch(choices(mask))).logits
  got = heads.BertForMultipleChoice(cfg).apply({"params": params}, choices(ids),
                                               choices(np.zeros_like(ids)), choices(mask))
  assert np.abs(np.asarray(got) - want.numpy()).max() <= 1e-4


def test_bfloat16_compute_stays_close_to_float32(tmp_path):
  path, _ = _hf_dir(tmp_path, "modernbert", "ForMaskedLM")
  cfg, params = modern_formats.read_hf(path, "pretraining")
  ids, mask = _inputs(8)
  pos = np.broadcast_to(np.arange(L, dtype=np.int32), ids.shape)
  f32 = modern.ModernForMaskedLM(cfg).apply({"params": params}, ids, None, mask, pos)
  bf16 = modern.ModernForMaskedLM(cfg.replace(dtype="bfloat16")).apply(
      {"params": params}, ids, None, mask, pos)
  a, b = np.asarray(f32["mlm_logits"]), np.asarray(bf16["mlm_logits"])
  real = mask.astype(bool)
  assert bf16["mlm_logits"].dtype == jnp.float32
  assert np.abs(a - b)[real].max() <= 0.1 * np.abs(a)[real].max()
  assert (a[real].argmax(-1) == b[real].argmax(-1)).mean() >= 0.9


@pytest.mark.parametrize("family", ["modernbert", "eurobert"])
def test_weights_config_json_does_not_describe_are_refused(tmp_path, family):
  """One layer fewer in config.json than the weights hold, or a tensor under `model.` that
  the family has not: one line naming the tensors as the file does and what to do; rotary
  frequencies older uploads saved (per layer or once) still read (issue 56 item 5)."""
  from bert_jax import loader  # pylint: disable=g-import-not-at-top
  path, _ = _hf_dir(tmp_path, family, "ForMaskedLM")
  n = _hf_config(family).num_hidden_layers
  message = hf_parity.refusal(hf_parity.edited_copy(path, tmp_path / "fewer",
                                                    {"num_hidden_layers": n - 1}))
  assert f"): model.layers.{n - 1}." in message, message
  assert f"hold {n} layers where config.json says num_hidden_layers={n - 1}" in message, message
  extra = {"model.extra.weight": np.ones(2, np.float32)}
  message = hf_parity.refusal(hf_parity.edited_copy(path, tmp_path / "extra", extra=extra))
  assert "unused tensors (1): model.extra.weight" in message, message
  loader.read(hf_parity.edited_copy(path, tmp_path / "fine", extra={
      "model.rotary_emb.inv_freq": np.ones(8, np.float32),
      "model.layers.0.attn.rotary_emb.inv_freq": np.ones(8, np.float32)}))


@pytest.mark.parametrize("family", ["modernbert", "eurobert"])
def test_an_export_of_other_layers_than_its_config_says_is_refused(tmp_path, family):
  """A bert_jax export whose bert_jax_config.json says one layer fewer than its weights
  built the smaller model: refused in one line as by every reader (issue 56 item 5)."""
  from bert_jax import formats, loader  # pylint: disable=g-import-not-at-top
  path, _ = _hf_dir(tmp_path, family, "ForMaskedLM")
  cfg, params = loader.read(path)
  formats.save_native(str(tmp_path / "ours"), cfg.replace(num_layers=cfg.num_layers - 1), params)
  with pytest.raises(formats.CheckpointMismatchError) as e:
    loader.read(str(tmp_path / "ours"))
  n, message = cfg.num_layers, str(e.value)
  assert "\n" not in message and f"): bert/encoder/layer_{n - 1}/" in message, message
  assert f"hold {n} layers where bert_jax_config.json says num_layers={n - 1}" in message


@pytest.mark.parametrize("family", ["modernbert", "eurobert"])
def test_an_encoder_export_holds_only_what_the_bare_model_loads(tmp_path, family):
  """The encoder alone (read with target="encoder" from a masked-LM checkpoint) exports as the
  family's bare model with no tensor transformers reports unexpected (its MLM head's
  `head.*` was written beside it)."""
  path, _ = _hf_dir(tmp_path, family, "ForMaskedLM")
  cfg, params = modern_formats.read_hf(path, "encoder")
  out = tmp_path / "export"
  modern_formats.export_hf(str(out), cfg, params)
  cls = getattr(transformers, {"modernbert": "ModernBert", "eurobert": "EuroBert"}[family]
                + "Model")
  _, info = cls.from_pretrained(out, output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
