"""Checkpoints a user points at that cannot be read: every entry point says which file and why,
in one line (convert, predict; fine-tuning's init_checkpoint is in test_finetune.py)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from bert_jax import convert, formats, loader, predict
from bert_jax.models import bert_formats
from bert_jax.models import bert as model_lib
from input_pipeline import errors
from tests.test_task_data import make_vocab


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """A tiny model as a HuggingFace directory and as a bert_jax export, and its vocabulary."""
  tmp = tmp_path_factory.mktemp("ckpts")
  tok = make_vocab(tmp, ["the cat sat on the mat"])
  cfg = model_lib.BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_layers=2, num_heads=2,
                             intermediate_size=32, max_position_embeddings=32)
  ids = jnp.ones((1, 4), jnp.int32)
  params = nn.unbox(model_lib.BertForPreTraining(cfg).init(jax.random.key(0), ids, ids, ids, ids))["params"]
  bert_formats.export_huggingface(str(tmp / "hf"), cfg, params)
  formats.save_native(str(tmp / "ours"), cfg, params)
  return tmp


def _truncate(path):
  data = path.read_bytes()
  path.write_bytes(data[:len(data) // 2])


@pytest.mark.parametrize("fmt,name", [("hf", "model.safetensors"), ("ours", formats.NATIVE_PARAMS)])
def test_truncated_safetensors_names_the_file(tmp_path, checkpoints, capsys, fmt, name):
  ckpt = tmp_path / fmt
  ckpt.mkdir()
  for f in (checkpoints / fmt).iterdir():
    (ckpt / f.name).write_bytes(f.read_bytes())
  _truncate(ckpt / name)
  expected = f"{ckpt / name} is truncated or corrupt"
  with pytest.raises(errors.UserError, match=expected):
    loader.read(str(ckpt), "encoder")
  for main, args in ((convert.main, [f"--input={ckpt}", f"--output={tmp_path / 'out'}"]),
                     (predict.main, [f"--checkpoint={ckpt}", f"--vocab={checkpoints / 'vocab.txt'}",
                                     "--text=the [MASK] sat"])):
    with pytest.raises(SystemExit) as e:
      main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and expected in err and "Traceback" not in err, err
  assert not (tmp_path / "out").exists()


def test_checkpoint_that_does_not_exist_says_so(tmp_path, checkpoints, capsys):
  missing = tmp_path / "no_such_model"
  with pytest.raises(errors.UserError, match=f"{missing} does not exist"):
    loader.read(str(missing))
  for main, args in ((convert.main, [f"--input={missing}", f"--output={tmp_path / 'out'}"]),
                     (predict.main, [f"--checkpoint={missing}", f"--vocab={checkpoints / 'vocab.txt'}",
                                     "--text=the [MASK] sat"]),
                     (predict.main, [f"--checkpoint={missing}", f"--vocab={checkpoints / 'vocab.txt'}",
                                     "--mode=classify", "--text=the cat"])):
    with pytest.raises(SystemExit) as e:
      main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"{missing} does not exist" in err, err
  # A Google TF checkpoint is a prefix: bert_model.ckpt itself never exists, its .index does.
  (tmp_path / "bert_model.ckpt.index").write_text("")
  with pytest.raises(Exception) as e:
    loader.read(str(tmp_path / "bert_model.ckpt"))
  assert "does not exist" not in str(e.value)
