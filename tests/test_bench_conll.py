"""bench/quality/suite_conll.py on tiny CoNLL files in the original format (IOB1, -DOCSTART- lines) and
a tiny random BERT directory: each side trains and is scored (no figure asserted)."""
import pathlib
import re

import pytest

transformers = pytest.importorskip("transformers")

from bench.quality import suite_conll  # noqa: E402
from tests import hf_parity  # noqa: E402

WORDS = ["eu", "rejects", "german", "call", "to", "boycott", "british", "lamb", "peter",
         "blackburn", "brussels", "."]
SENTENCES = ("EU NNP B-NP I-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP I-MISC\ncall NN I-NP O\n"
             "to TO B-VP O\nboycott VB I-VP O\nBritish JJ B-NP I-MISC\nlamb NN I-NP O\n. . O O\n\n"
             "Peter NNP B-NP I-PER\nBlackburn NNP I-NP I-PER\n\nBRUSSELS NNP B-NP I-LOC\n\n")


@pytest.mark.slow  # three fine-tuning processes (~90 s)
def test_suite_conll_runs_both_sides_on_the_original_format(tmp_path, capsys):
  config = transformers.BertConfig(vocab_size=5 + len(WORDS), hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=48,
                                   max_position_embeddings=64)
  model, _ = hf_parity.hf_dir(tmp_path, transformers.BertModel, config, lambda n: "LayerNorm" in n)
  (pathlib.Path(model) / "vocab.txt").write_text(
      "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")
  (pathlib.Path(model) / "tokenizer_config.json").write_text(
      '{"tokenizer_class": "BertTokenizer", "do_lower_case": true}')
  data = tmp_path / "conll"
  data.mkdir()
  (data / "eng.train").write_text("-DOCSTART- -X- O O\n\n" + SENTENCES * 24)
  (data / "eng.testa").write_text("-DOCSTART- -X- O O\n\n" + SENTENCES * 2)
  rows = suite_conll.main([f"--workdir={tmp_path / 'w'}", f"--data_dir={data}", f"--model={model}",
                           "--epochs=2", "--seeds=1", "--max_seq_length=32", "--learning_rate=1e-3",
                           "--train_sentences=50",
                           "--no_record"])
  assert set(rows) == {"bert_jax", "bert_jax_bias_correction", "transformers"}
  for runs in rows.values():
    assert len(runs) == 1 and len(runs[0]["f1"]) == 2 and all(0 <= f <= 1 for f in runs[0]["f1"])
  out = capsys.readouterr().out
  for name in rows:
    assert re.search(rf"^\| {name} \| \d+\.\d\d \|", out, re.M), out
