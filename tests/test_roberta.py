"""RoBERTa and XLM-RoBERTa (bert_jax/models/roberta.py) against transformers in float32, on
HuggingFace directories built here as the Hub ships them (config.json, model.safetensors,
tokenizer.json with its vocab.json / merges.txt, tokenizer_config.json) with random weights:
what only these families have (their tokenizers, position offsets, presets, jobs end to end).
What every family shares is tests/test_conformance.py's."""
from __future__ import annotations

import json
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import convert, formats, loader
from bert_jax.models import roberta
from bert_jax.models import bert as model_lib
from input_pipeline import features
from input_pipeline.tokenizer import Tokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tests import hf_parity  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
tokenizers = pytest.importorskip("tokenizers")

V, L = 120, 24
STEM = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta"}
TEXTS = ["The cat sat on the mat.", "A dog ran in the park, quickly!", "the mat of the cat",
         "Parks and cats and dogs."] * 8


def _hf_config(family, **kw):
  cls = getattr(transformers, STEM[family] + "Config")
  return cls(**{**dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, max_position_embeddings=L + 2, pad_token_id=1,
                       bos_token_id=0, eos_token_id=2, type_vocab_size=1,
                       attn_implementation="eager"), **kw})


def _hf_dir(tmp_path, family, arch, seed=0, **kw):
  cls = getattr(transformers, STEM[family] + arch)
  return hf_parity.hf_dir(tmp_path, cls, _hf_config(family, **kw),
                          lambda name: "LayerNorm" in name or "layer_norm" in name, seed)


def _inputs(seed=0, batch=3, pad=(0, 5, 11)):
  return hf_parity.padded_inputs(seed, batch, pad, V, L, first_id=0, pad_id=1)


_torch = hf_parity.to_torch


def _byte_bpe_dir(tmp_path):
  """A RoBERTa tokenizer as the Hub ships one: tokenizer.json (byte-level BPE, RobertaProcessing),
  vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json."""
  from tokenizers import decoders, models, pre_tokenizers, processors, trainers  # pylint: disable=g-import-not-at-top
  d = tmp_path / "roberta-tok"
  d.mkdir()
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
  tok.train_from_iterator(TEXTS, trainers.BpeTrainer(
      vocab_size=V, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
  tok.save(str(d / "tokenizer.json"))
  tok.model.save(str(d))
  names = dict(bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
               unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")
  (d / "special_tokens_map.json").write_text(json.dumps(names))
  (d / "tokenizer_config.json").write_text(json.dumps(
      {"tokenizer_class": "RobertaTokenizer", "add_prefix_space": False,
       "model_max_length": 512, **names}))
  return d


def _unigram_dir(tmp_path):
  """An XLM-R tokenizer: tokenizer.json (Unigram, Metaspace, `<s> A </s> </s> B </s>`)."""
  from tokenizers import decoders, models, pre_tokenizers, processors, trainers  # pylint: disable=g-import-not-at-top
  d = tmp_path / "xlmr-tok"
  d.mkdir()
  tok = tokenizers.Tokenizer(models.Unigram())
  tok.pre_tokenizer = pre_tokenizers.Metaspace()
  tok.decoder = decoders.Metaspace()
  specials = ["<s>", "<pad>", "</s>", "<unk>"]
  tok.train_from_iterator(TEXTS, trainers.UnigramTrainer(
      vocab_size=V - 1, special_tokens=specials, unk_token="<unk>"))
  tok.add_special_tokens(["<mask>"])
  tok.post_processor = processors.TemplateProcessing(
      single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
      special_tokens=[("<s>", 0), ("</s>", 2)])
  tok.save(str(d / "tokenizer.json"))
  names = dict(bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
               unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")
  (d / "special_tokens_map.json").write_text(json.dumps(names))
  (d / "tokenizer_config.json").write_text(json.dumps(
      {"tokenizer_class": "XLMRobertaTokenizer", "model_max_length": 512, **names}))
  return d


@pytest.mark.parametrize("kind", ["byte_bpe", "unigram"])
def test_tokenizer_ids_equal_autotokenizers_with_pairs(tmp_path, kind):
  d = (_byte_bpe_dir if kind == "byte_bpe" else _unigram_dir)(tmp_path)
  ours = Tokenizer.from_path(str(d))
  theirs = transformers.AutoTokenizer.from_pretrained(str(d))
  assert ours.pair_seps == 2 and ours.tokens[ours.cls_id] == "<s>"
  assert ours.tokens[ours.sep_id] == "</s>" and ours.tokens[ours.mask_id] == "<mask>"
  for a, b in [("The cat sat.", None), ("A dog ran", "in the park!"), ("mat", "cats and dogs")]:
    ids, segments = features.encode_pair(ours, ours.encode(a),
                                         None if b is None else ours.encode(b))
    want = theirs(a, b)["input_ids"]
    assert ids == want, (a, b)
    assert len(ids) == len(ours.encode(a)) + (0 if b is None else len(ours.encode(b))) + (
        features.special_count(ours, b is not None))
    assert len(segments) == len(ids)


def test_presets_and_the_model_fields():
  base = roberta.RobertaConfig.from_preset("roberta-base")
  assert (base.vocab_size, base.hidden_size, base.max_length, base.type_vocab_size) == (
      50265, 768, 512, 1)
  large = roberta.config_from_fields({"preset": "large"}, None, "xlm-roberta")
  assert (large.family, large.vocab_size, large.num_layers) == ("xlm-roberta", 250002, 24)
  mine = roberta.config_from_fields({"preset": "base", "num_layers": 2}, 300, "roberta")
  assert (mine.vocab_size, mine.num_layers) == (300, 2)
  assert formats.config_from_dict(mine.to_dict()) == mine
  params = nn.unbox(model_lib.BertForPreTraining(mine.replace(hidden_size=32, num_heads=2,
                                                              intermediate_size=64), nsp=False)
                    .init(jax.random.key(0), *(jnp.ones((1, 512), jnp.int32),) * 3,
                          jnp.ones((1, 4), jnp.int32)))
  assert params["params"]["bert"]["embeddings"]["position_embeddings"]["embedding"].shape == (
      514, 32)


def _roberta_model_dir(tmp_path):
  """A RobertaForMaskedLM directory with its tokenizer files, the vocabulary's size."""
  tok_dir = _byte_bpe_dir(tmp_path)
  size = Tokenizer.from_path(str(tok_dir)).vocab_size
  path, _ = _hf_dir(tmp_path, "roberta", "ForMaskedLM", vocab_size=size)
  for f in tok_dir.iterdir():
    (pathlib.Path(path) / f.name).write_bytes(f.read_bytes())
  return path


def test_fine_tunes_predicts_and_exports_a_classifier_transformers_loads(tmp_path, capsys):
  """CoLA from a RoBERTa checkpoint through the fine-tuning job, predict --mode=classify on
  its best/, and convert --target=all --to=huggingface: RobertaForSequenceClassification with
  every key and the same logits."""
  path = _roberta_model_dir(tmp_path)
  hf_parity.finetune_and_predict(tmp_path, path, capsys)
  hf_parity.exported_classifier_matches(
      tmp_path, path, transformers.RobertaForSequenceClassification, attn_implementation="eager")


def test_squad_windows_put_the_answer_after_the_two_separators(tmp_path):
  """SQuAD features with RoBERTa's `<s> q </s></s> c </s>`: the gold span's tokens are the
  answer's, and the layout is transformers' for the same question and context."""
  from input_pipeline import squad  # pylint: disable=g-import-not-at-top
  d = _byte_bpe_dir(tmp_path)
  tok = Tokenizer.from_path(str(d))
  context = "The cat sat on the mat. A dog ran in the park, quickly!"
  answer = "in the park"
  ex = squad.QAExample("q", "Where did the dog run?", context, (answer,), context.index(answer))
  feats = squad.convert_examples([ex], tok, max_seq_length=160, doc_stride=64,
                                 max_query_length=64)
  ids = feats["input_ids"][0][feats["input_mask"][0] > 0].tolist()
  theirs = transformers.AutoTokenizer.from_pretrained(str(d))
  assert ids == theirs(ex.question, context)["input_ids"]
  s, e = int(feats["start_positions"][0]), int(feats["end_positions"][0])
  assert tok.decode(ids[s:e + 1]).strip() == answer
  chars = feats["token_chars"][0]
  assert context[chars[s][0]:chars[e][1]].strip() == answer


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_pretrains_from_scratch_and_exports(tmp_path):
  """config.model.family=roberta through the pre-training job (its own vocabulary, built from
  a corpus as RoBERTa's: cased byte-level BPE; positions from 2, one token type), resumed as
  a no-op, exported to RobertaForMaskedLM with every key and with a tokenizer AutoTokenizer
  reads as ours."""
  from tests import test_train_utils as tu  # pylint: disable=g-import-not-at-top
  work = tmp_path / "run"
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("The players played in the garden.\nThe puppy was playing there.\n\n"
                    "Another document starts here.\nIt talks about runners who run.\n\n" * 40)
  # (BERT's configs pin BERT's token types and activation: RoBERTa's given here)
  args = tu.main_args(work, model__family="roberta", model__preset="base",
                      model__max_position_embeddings=34, model__num_layers=2,
                      model__intermediate_size=128, model__type_vocab_size=1,
                      model__hidden_act="gelu", data__nsp=False, model__vocab_size=None,
                      synthetic_data=False, build__corpus=str(corpus), build__vocab_size=300,
                      build__num_shards=1)
  log = tu.run(args).stderr
  assert "Training a 300-entry bpe vocabulary" in log, log[-3000:]
  assert (work / "vocab" / "tokenizer.json").is_file()
  cfg, params = loader.read(str(work))
  assert (cfg.family, cfg.position_offset, cfg.type_vocab_size, cfg.num_layers) == (
      "roberta", 2, 1, 2)
  assert "seq_relationship" not in params
  assert "Resumed" in tu.run(args).stderr or tu.checkpoint_steps(work) == [6]
  convert.main([f"--input={work}", f"--output={tmp_path / 'hf'}", "--to=huggingface"])
  _, info = transformers.RobertaForMaskedLM.from_pretrained(tmp_path / "hf",
                                                            output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  ours = Tokenizer.from_path(str(work / "vocab"))
  theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
  text = "The Players played in the garden."
  assert not ours.lowercase and ours.encode(text) != ours.encode(text.lower())
  assert theirs(text)["input_ids"] == [ours.cls_id] + ours.encode(text) + [ours.sep_id]


@pytest.mark.slow
def test_the_suite_runs_on_roberta(tmp_path):
  """configs/suite.py on a RoBERTa checkpoint: CoLA, MRPC (pairs: two separators) and STS-B
  reported."""
  path = _roberta_model_dir(tmp_path)
  hf_parity.suite_runs_on(tmp_path, path)


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta"])
def test_tensors_left_out_are_named_as_the_file_names_them(tmp_path, family, caplog):
  """The encoder of a ...ForMaskedLM directory leaves its head out: the warning names the
  family's model and the file's tensors (lm_head.*), not "a encoder BERT" and BERT's
  cls.predictions.* (issue 56 item 11)."""
  import logging  # pylint: disable=g-import-not-at-top
  path, _ = _hf_dir(tmp_path, family, "ForMaskedLM")
  caplog.set_level(logging.WARNING)
  loader.read(path, "encoder")
  warned = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
  assert len(warned) == 1, warned
  assert f"the {family} encoder" in warned[0] and "lm_head.dense.weight" in warned[0], warned
  assert "BERT" not in warned[0] and "cls.predictions" not in warned[0], warned


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta"])
def test_weights_config_json_does_not_describe_are_refused(tmp_path, family):
  """1 layer in config.json over weights of 2, or a tensor under `roberta.` that RoBERTa has
  not: one line naming the tensors as the file does and what to do; the position_ids buffer
  older uploads hold still reads (issue 56 item 5)."""
  path, _ = _hf_dir(tmp_path, family, "ForMaskedLM")
  message = hf_parity.refusal(hf_parity.edited_copy(path, tmp_path / "fewer",
                                                    {"num_hidden_layers": 1}))
  assert "unused tensors (16): roberta.encoder.layer.1." in message, message
  assert "hold 2 layers where config.json says num_hidden_layers=1" in message, message
  extra = {"roberta.extra.weight": np.ones(2, np.float32)}
  message = hf_parity.refusal(hf_parity.edited_copy(path, tmp_path / "extra", extra=extra),
                              "encoder")
  assert "unused tensors (1): roberta.extra.weight" in message, message
  loader.read(hf_parity.edited_copy(path, tmp_path / "fine", extra={
      "roberta.embeddings.position_ids": np.arange(L + 2)[None]}))



def _continue_config(path):
  """The tiny pre-training config continuing from the RoBERTa directory `path` (its sizes;
  config.model has no layer_norm_eps, nor position_offset)."""
  from tests import test_train_utils as tu  # pylint: disable=g-import-not-at-top
  return tu.tiny_config(
      init_checkpoint=path, model__family="roberta", model__preset="base", model__vocab_size=V,
      model__hidden_size=32, model__num_layers=2, model__num_heads=4,
      model__intermediate_size=64, model__max_position_embeddings=L + 2,
      model__type_vocab_size=1, model__hidden_act="gelu", data__max_seq_length=L,
      data__nsp=False, num_train_steps=1, async_checkpointing=False)


def test_the_model_takes_what_config_model_cannot_set_from_init_checkpoint(tmp_path):
  """A RoBERTa checkpoint whose layer_norm_eps (1e-12, transformers' RobertaConfig default)
  is not the family's 1e-5 was told to set config.model.layer_norm_eps, a field that does not
  exist, so it could not be pre-trained further: the model config now takes the fields
  config.model has none for from the checkpoint, and its weights load (issue 56 item 10)."""
  from bert_jax import registry  # pylint: disable=g-import-not-at-top
  path, _ = _hf_dir(tmp_path, "roberta", "ForMaskedLM")
  assert loader.read(path)[0].layer_norm_eps == 1e-12
  cfg = registry.model_config(_continue_config(path), V)
  assert (cfg.layer_norm_eps, cfg.position_offset) == (1e-12, 2)
  ids, device = jnp.ones((1, 8), jnp.int32), jax.sharding.SingleDeviceSharding(jax.devices()[0])
  shapes = jax.eval_shape(lambda: nn.unbox(registry.masked_lm(cfg, False).init(
      jax.random.key(0), ids, ids, ids, ids[:, :2]))["params"])
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                          shapes)
  fresh = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)
  params = loader.load_into(path, abstract, fresh, config=cfg)
  want = loader.read(path)[1]["bert"]["encoder"]["layer_1"]["output"]["kernel"]
  np.testing.assert_array_equal(params["bert"]["encoder"]["layer_1"]["output"]["kernel"], want)


@pytest.mark.slow  # the job end to end (~15 s); the test above checks the same in-process
def test_pretrains_further_from_a_checkpoint_of_another_layer_norm_eps(tmp_path):
  """The pre-training job from that checkpoint: one step, the run records its 1e-12."""
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  path, _ = _hf_dir(tmp_path, "roberta", "ForMaskedLM")
  state = train.train_and_evaluate(_continue_config(path), str(tmp_path / "run"))
  cfg, _ = loader.read(str(tmp_path / "run"))
  assert int(state.step) == 1 and cfg.layer_norm_eps == 1e-12
