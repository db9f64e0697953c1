"""Published BertForMaskedLM checkpoints (MLM head, no NSP head, extra task heads), as the
Hub ships them: fill-mask parity with transformers, continued pre-training with NSP off
and on, fine-tuning, and export back to transformers (issue 11)."""
import json
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax import formats, loader  # noqa: E402
from bert_jax.models import bert_formats  # noqa: E402
from bert_jax.models import bert as model_lib  # noqa: E402
from bert_jax import predict, train  # noqa: E402
from input_pipeline import testing  # noqa: E402
from input_pipeline import tokenizer as tokenizer_lib  # noqa: E402
from tests import test_train_utils as tu  # noqa: E402

tu.use_compilation_cache()
EXTRA = ("cls.extra.weight", "cls.extra.bias")  # another task's head saved beside the MLM head


def _hf_config(vocab_size):
  # The tiny shape of tests/test_train_utils.TINY (preset "tiny" + overrides), erf GELU.
  return transformers.BertConfig(
      vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=256, max_position_embeddings=32, hidden_act="gelu",
      attn_implementation="eager")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
  """A tagged corpus (prepared) and, beside it, a BertForMaskedLM directory as the Hub ships
  one: config.json, model.safetensors (+ cls.extra.*), vocab.txt, tokenizer_config.json."""
  from safetensors.torch import load_file, save_file  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("mlm_hub")
  corpus = testing.make_tagged_corpus(str(root / "corpus"), num_docs=8, words_per_doc=40)
  vocab = open(corpus["vocab"], encoding="utf-8").read()
  torch.manual_seed(0)
  model = transformers.BertForMaskedLM(_hf_config(len(vocab.splitlines()))).eval()
  with torch.no_grad():  # perturb every tensor, so parity sees each one
    for name, p in model.named_parameters():
      p.add_(torch.randn_like(p) * (0.1 if ("LayerNorm" in name or "bias" in name) else 0.02))
  d = root / "bert-mlm"
  model.save_pretrained(d)
  state = load_file(d / "model.safetensors")
  assert not any(k.startswith(("cls.seq_relationship", "bert.pooler")) for k in state)
  state[EXTRA[0]] = torch.randn(3, 64)
  state[EXTRA[1]] = torch.randn(3)
  save_file(state, d / "model.safetensors", metadata={"format": "pt"})
  (d / "vocab.txt").write_text(vocab, encoding="utf-8")
  (d / "tokenizer_config.json").write_text(json.dumps(
      {"do_lower_case": True, "tokenizer_class": "BertTokenizer", "model_max_length": 32}))
  return {"dir": str(d), "model": model, "corpus": corpus}


def _fill_mask_batch(tok, n_words=12):
  rng = np.random.default_rng(0)
  texts = [" ".join(f"d{rng.integers(8)}w{rng.integers(40)}" for _ in range(n_words))
           for _ in range(3)]
  ids = np.array([[tok.cls_id] + tok.encode(t)[:n_words] + [tok.sep_id] for t in texts])
  positions = np.array([[1, 4, 7], [2, 3, 9], [5, 6, 12]])
  ids[np.arange(3)[:, None], positions] = tok.mask_id
  return ids, positions


def test_fill_mask_logits_match_transformers(hub, caplog):
  caplog.set_level(logging.WARNING)
  cfg, params = loader.read(hub["dir"])
  assert formats.heads(params) == {"mlm": True, "nsp": False, "pooler": False}
  warned = [r.getMessage() for r in caplog.records if "cls.extra" in r.getMessage()]
  assert len(warned) == 1 and all(name in warned[0] for name in EXTRA), warned
  tok = tokenizer_lib.Tokenizer.from_path(hub["dir"])
  ids, positions = _fill_mask_batch(tok)
  mask = np.ones_like(ids)
  out = model_lib.BertForPreTraining(cfg, nsp=False).apply(
      {"params": params}, jnp.asarray(ids), jnp.zeros_like(ids), jnp.asarray(mask), jnp.asarray(positions))
  assert set(out) == {"mlm_logits"}
  with torch.no_grad():
    ref = hub["model"](input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  ref = np.take_along_axis(ref, positions[..., None], 1)
  error = float(np.max(np.abs(np.asarray(out["mlm_logits"]) - ref)))
  print(f"fill-mask logits max |ours - transformers| = {error:.2e}")
  assert error <= 1e-4


def test_predict_fill_mask_cli_on_the_hub_directory(hub, capsys):
  """`predict --checkpoint=DIR --vocab=DIR`: the top candidate is transformers' argmax."""
  text = "d1w3 d1w4 [MASK] d1w6 d1w7"
  predict.main([f"--checkpoint={hub['dir']}", f"--vocab={hub['dir']}", f"--text={text}",
                "--top_k=3"])
  printed = capsys.readouterr().out.splitlines()
  assert printed[0] == text and printed[1].startswith("  [MASK] #1: ")
  ours_top = printed[1].split(": ", 1)[1].split(" (")[0]
  ref_tok = transformers.AutoTokenizer.from_pretrained(hub["dir"])
  enc = ref_tok(text.replace("[MASK]", ref_tok.mask_token), return_tensors="pt")
  with torch.no_grad():
    logits = hub["model"](**enc).logits[0]
  pos = int((enc["input_ids"][0] == ref_tok.mask_token_id).nonzero()[0, 0])
  assert ours_top == ref_tok.convert_ids_to_tokens([int(logits[pos].argmax())])[0]
  # An encoder-only checkpoint is refused for fill-mask with a message that says why (one
  # line, exit 2: CheckpointMismatchError is a UserError).
  _, enc_params = loader.read(hub["dir"], target="encoder")
  enc_dir = os.path.join(os.path.dirname(hub["dir"]), "encoder_only")
  formats.save_native(enc_dir, loader.read(hub["dir"])[0], enc_params)
  with pytest.raises(formats.CheckpointMismatchError, match="no masked-LM head"):
    loader.read(enc_dir)
  with pytest.raises(SystemExit) as e:
    predict.main([f"--checkpoint={enc_dir}", f"--vocab={hub['dir']}", f"--text={text}"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and "no masked-LM head" in err and "Traceback" not in err, err


def test_export_round_trips_to_bert_for_masked_lm(hub, tmp_path):
  cfg, params = loader.read(hub["dir"])
  bert_formats.export_huggingface(str(tmp_path / "export"), cfg, params)
  assert json.loads((tmp_path / "export" / "config.json").read_text())["architectures"] == [
      "BertForMaskedLM"]
  reloaded, info = transformers.BertForMaskedLM.from_pretrained(
      tmp_path / "export", output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
  ref = hub["model"].state_dict()
  got = reloaded.state_dict()
  assert set(got) == set(ref)
  for name, value in got.items():
    assert torch.equal(value, ref[name]), name
  cfg2, params2 = loader.read(str(tmp_path / "export"))
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, params2)


def test_encoder_target_names_the_heads_it_leaves_out(hub, caplog):
  caplog.set_level(logging.WARNING)
  _, params = loader.read(hub["dir"], target="encoder")
  assert set(params) == {"embeddings", "encoder"}  # BertForMaskedLM has no pooler
  warned = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
  assert len(warned) == 1
  assert "cls.predictions.transform.dense.weight" in warned[0] and "cls.extra.weight" in warned[0]


def _continue_config(hub, workdir_nsp: bool, **overrides):
  corpus = hub["corpus"]
  return tu.tiny_config(
      synthetic_data=False, init_checkpoint=hub["dir"], model__vocab_size=None,
      model__hidden_act="gelu", data__prepared_dir=corpus["prepared"],
      data__vocab_path=hub["dir"], data__nsp=workdir_nsp, num_train_steps=4,
      checkpoint_every_steps=2, log_every_steps=1, max_steps_per_run=2,
      async_checkpointing=False, **overrides)


@pytest.mark.parametrize("nsp", [False, True], ids=["nsp_off", "nsp_on"])
def test_init_from_mlm_checkpoint(hub, nsp, caplog):
  """Every tensor of the checkpoint lands in the model; with NSP on, the NSP head and the
  pooler start fresh (and the log says so); with NSP off the model has neither."""
  caplog.set_level(logging.INFO)
  config = _continue_config(hub, nsp)
  trainer = tu.pretraining_trainer(config, 326, devices=jax.devices()[:1])
  with trainer.activate():
    fresh = trainer.init().params
    params = loader.load_into(hub["dir"], trainer.abstract.params, fresh,
                              config=trainer.model.config)
  _, expected = loader.read(hub["dir"])
  got = tu.flat(params)
  for key, value in tu.flat(expected).items():
    np.testing.assert_array_equal(got[key], value, err_msg=key)
  fresh_msgs = [r.getMessage() for r in caplog.records if "fresh initialisation" in r.getMessage()]
  if nsp:
    np.testing.assert_array_equal(got["['seq_relationship']['kernel']"],
                                  tu.flat(fresh)["['seq_relationship']['kernel']"])
    assert len(fresh_msgs) == 1 and "NSP head" in fresh_msgs[0] and "pooler" in fresh_msgs[0]
  else:
    assert set(got) == set(tu.flat(expected)) and not fresh_msgs


def test_continued_pretraining_nsp_off_runs_and_resumes(hub, tmp_path):
  """Domain-adapt a published MLM checkpoint on our corpus with its own vocabulary."""
  workdir = str(tmp_path / "work")
  config = _continue_config(hub, False)
  train.train_and_evaluate(config, workdir)
  assert tu.checkpoint_steps(workdir) == [2]
  train.train_and_evaluate(config, workdir)  # resumes from step 2
  assert tu.checkpoint_steps(workdir) == [2, 4]
  state = tu.load_checkpoint(workdir)
  assert int(state["step"]) == 4
  keys = set(tu.flat(state["params"]))
  assert not any("seq_relationship" in k or "pooler" in k for k in keys)
  loss = tu.read_scalars(workdir, "train/loss")
  assert sorted(loss) == [1, 2, 3, 4] and all(np.isfinite(v) for v in loss.values())
  assert not tu.read_scalars(workdir, "train/nsp_accuracy")
  assert tu.read_scalars(workdir, "train/mlm_accuracy")


def test_lowercase_override_reaches_the_tokenizer(hub, capsys, monkeypatch):
  """predict --nolowercase: the vocabulary's do_lower_case=true is overridden."""
  seen = []
  real = tokenizer_lib.Tokenizer.from_path.__func__

  def spy(cls, path, lowercase=None):
    tok = real(cls, path, lowercase)
    seen.append(tok.lowercase)
    return tok

  monkeypatch.setattr(tokenizer_lib.Tokenizer, "from_path", classmethod(spy))
  for flag, expected in (("--nolowercase", False), ("--lowercase", True), (None, True)):
    predict.main([f"--checkpoint={hub['dir']}", f"--vocab={hub['dir']}", "--text=D1W3 [MASK]"]
                 + ([flag] if flag else []))
    assert seen[-1] is expected, flag
  capsys.readouterr()
