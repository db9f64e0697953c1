"""Checkpoints a user points at that cannot be read: every entry point says which file and why,
in one line (convert, predict; fine-tuning's init_checkpoint is in test_finetune.py)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from bert_jax import convert, formats, loader, predict
from bert_jax.models import bert_formats
from bert_jax.models import bert as model_lib
from common import errors
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


def _bert_form(checkpoints, d, form: str, config_change=None, extra=None):
  """The tiny BertForPreTraining as `form` ships it in directory `d`: "safetensors" (the Hub's
  model.safetensors + config.json), "bin" (an older upload's pytorch_model.bin) or "tf" (Google's
  bert_model.ckpt + bert_config.json); its config changed by `config_change`, with the tensors
  `extra` (file names) added."""
  import json  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  d.mkdir()
  state = {**load_file(checkpoints / "hf" / "model.safetensors"), **(extra or {})}
  config = {**json.loads((checkpoints / "hf" / "config.json").read_text()), **(config_change or {})}
  if form == "safetensors":
    save_file(state, d / "model.safetensors", metadata={"format": "pt"})
  elif form == "bin":
    torch = pytest.importorskip("torch")
    torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()},
               d / "pytorch_model.bin")
  else:
    from tests.test_convert import _write_tf_checkpoint  # pylint: disable=g-import-not-at-top
    _write_tf_checkpoint(d / "bert_model.ckpt", formats.canonical_names(state))
    (d / "bert_config.json").write_text(json.dumps(config))
    return d
  (d / "config.json").write_text(json.dumps(config))
  return d


@pytest.mark.parametrize("form", ["safetensors", "bin", "tf"])
def test_tensors_the_config_does_not_describe_are_refused_in_every_form(tmp_path, checkpoints,
                                                                        capsys, form):
  """A config that says 1 layer over weights of 2, or a tensor under the encoder that BERT
  has not, is refused in one line naming the tensors as the file does (the first few and
  the count) and what to do, exit 2; transformers' harmless buffers and another task's head
  still read (issue 56 item 5)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  tf = form == "tf"
  d = _bert_form(checkpoints, tmp_path / "fewer", form, {"num_hidden_layers": 1})
  with pytest.raises(formats.CheckpointMismatchError) as e:
    loader.read(str(d), "encoder")
  layer1 = "bert/encoder/layer_1/" if tf else "bert.encoder.layer.1."
  message, config = str(e.value), "bert_config.json" if tf else "config.json"
  assert "\n" not in message and f"unused tensors (16): {layer1}" in message, message
  assert f"hold 2 layers where {config} says num_hidden_layers=1" in message, message
  with pytest.raises(SystemExit) as e:
    convert.main([f"--input={d}", f"--output={tmp_path / 'out'}"])
  err = capsys.readouterr().err.strip()
  assert e.value.code == 2 and "\n" not in err and f"unused tensors (16): {layer1}" in err, err
  d = _bert_form(checkpoints, tmp_path / "extra", form, extra={"bert.extra.weight": np.ones(3)})
  with pytest.raises(formats.CheckpointMismatchError,
                     match=f"unused tensors \\(1\\): bert{'/' if tf else '.'}extra"):
    loader.read(str(d), "encoder")
  harmless = {"cls.extra.weight": np.ones(3, np.float32)}  # another task's head: left out
  if not tf:  # transformers' buffers of older uploads
    harmless.update({"bert.embeddings.position_ids": np.arange(32)[None],
                     "bert.embeddings.token_type_ids": np.zeros((1, 32), np.int64)})
  loader.read(str(_bert_form(checkpoints, tmp_path / "fine", form, extra=harmless)), "encoder")


def test_an_export_of_other_layers_than_its_config_says_is_refused(tmp_path, checkpoints):
  """A bert_jax export whose bert_jax_config.json says 1 layer over weights of 2 read as a
  1-layer model, the other layer dropped without a word; it is refused in one line as by
  every reader, and so is a tensor the encoder has not (issue 56 item 5)."""
  import json  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  d = shutil.copytree(checkpoints / "ours", tmp_path / "fewer")
  config = json.loads((d / formats.NATIVE_CONFIG).read_text())
  (d / formats.NATIVE_CONFIG).write_text(json.dumps({**config, "num_layers": 1}))
  for target in ("pretraining", "encoder", "all"):
    with pytest.raises(formats.CheckpointMismatchError) as e:
      loader.read(str(d), target)
    message = str(e.value)
    assert "\n" not in message and "unused tensors (16): bert/encoder/layer_1/" in message
    assert "hold 2 layers where bert_jax_config.json says num_layers=1" in message, message
  d = shutil.copytree(checkpoints / "ours", tmp_path / "extra")
  state = load_file(d / formats.NATIVE_PARAMS)
  save_file({**state, "bert/encoder/layer_0/extra": np.ones(2, np.float32)},
            d / formats.NATIVE_PARAMS)
  with pytest.raises(formats.CheckpointMismatchError,
                     match="unused tensors \\(1\\): bert/encoder/layer_0/extra"):
    loader.read(str(d), "all")


def test_a_google_checkpoint_by_its_prefix_comes_with_its_vocabulary(tmp_path):
  """`.../bert_model.ckpt` (the documented form) names the vocab.txt beside it for every
  reader of loader.checkpoint_vocab (predict, embed_eval, history), not only convert's."""
  (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n")
  (tmp_path / "bert_model.ckpt.index").write_bytes(b"")
  assert loader.checkpoint_vocab(str(tmp_path / "bert_model.ckpt")) == str(tmp_path)
