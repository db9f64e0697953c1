"""The documentation still matches the code.

- README.md is the front door: at most 150 lines, opening with the two commands a newcomer
  pastes (the second is the one .ci/run runs), byte for byte.
- Every command of a fenced ```bash / ```sh block in README.md, docs/*.md and
  input_pipeline/README.md of the form `python -m MODULE ...` parses: MODULE exists, each
  `--flag` it passes is one of MODULE's flags (`--noX` only for a boolean X; an enum flag's
  value among its values), and a `--config=FILE[:ARG]` loads (`get_config(ARG)`) with every
  `--config.a.b=value` override applied as the job applies it (the field exists and the
  value converts). Lines are joined at backslash continuations and split at `&&`, `||`,
  `;` and `|`; `#` comments, `[...]` around optional flags and tokens that are not flags
  (`...`, argparse values) are dropped. Segments that are not `python -m` (pip, cd,
  export, gcloud, bash launch/..., sbatch, tensorboard) are not checked, nor a MODULE or
  config file spelled with a `$`-variable.
  How each module's flags are known (nothing is compiled, nothing runs):
    * bert_jax.main: the absl flags it defines at import (in the global FLAGS, by module);
      its `--config` and overrides as above.
    * bert_jax.predict, bert_jax.convert, bert_jax.embed_eval (`_flags()`),
      input_pipeline.vocab, input_pipeline.inspect (`_flag_values()`) and
      input_pipeline.prepare (`flag_values()`): the FlagValues their factory returns
      (inspect's `--config` loads as the main job's does).
    * input_pipeline.prepare_hosts: the FlagValues its `main` builds (prepare's flags and
      its own), captured at `errors.parse_flags` before anything runs.
    * bench.*: argparse parsers built inside `main`: the option strings of the module's
      `add_argument` calls, read from its source, and those of bench/harness.py's skeleton
      when the module builds its parser with `harness.parser` (values and choices not checked).
    * any other module (e.g. pytest): only that it exists (importlib.util.find_spec).
- Every module of bert_jax/ (and models/, configs/) and input_pipeline/ is named in a table:
  README.md's table of pieces or docs/architecture.md for bert_jax (a configs/ row may list
  the config files by name), input_pipeline/README.md's table for input_pipeline. The
  directories are globbed when the test runs.
- Every relative link in README.md, docs/*.md, input_pipeline/README.md, bench/README.md and
  bench/RESULTS.md (the index of the results files, one per group of benchmarks) points at a
  file that exists (and, with `#anchor`, at one of its headings).
"""
from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import pathlib
import re
import shlex

from absl import flags
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
INSTALL_AND_TRAIN = ("pip install -c constraints.txt -e . && python -m bert_jax.main "
                     "--config=configs/tiny_pretrain.py --workdir=/tmp/bert_tiny")
INSTALL_AND_TEST = 'pip install -c constraints.txt -e ".[test]" && python -m pytest -q tests'
MAX_README_LINES = 150


def _doc_files() -> list[pathlib.Path]:
  return [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "input_pipeline" / "README.md"]


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
  """(language, body) of each fenced block."""
  return [(m.group(1), m.group(2))
          for m in re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```", text, re.S | re.M)]


# --------------------------------------------------------------------------------------
# (a) the front door


def test_readme_is_a_front_door_opening_with_the_two_commands():
  text = README.read_text(encoding="utf-8")
  lines = text.splitlines()
  assert len(lines) <= MAX_README_LINES, (
      f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move reference "
      "material to docs/")
  blocks = _fenced_blocks(text)
  assert [b for _, b in blocks[:2]] == [INSTALL_AND_TRAIN + "\n", INSTALL_AND_TEST + "\n"], (
      "README.md's first two fenced blocks must be the two commands, byte for byte")
  assert all(lang == "bash" for lang, _ in blocks[:2])
  # At the very top: before the first section heading.
  first_section = next(i for i, l in enumerate(lines) if l.startswith("## "))
  top = "\n".join(lines[:first_section])
  assert INSTALL_AND_TRAIN in top and INSTALL_AND_TEST in top
  # CI runs the second command exactly.
  assert INSTALL_AND_TEST in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


# --------------------------------------------------------------------------------------
# (b) every documented command parses


class _Captured(Exception):

  def __init__(self, fv):
    super().__init__("captured")
    self.fv = fv


def _factory_flags(module) -> flags.FlagValues | None:
  for name in ("_flags", "_flag_values", "flag_values"):
    factory = getattr(module, name, None)
    if callable(factory):
      fv = factory()
      if isinstance(fv, flags.FlagValues):
        return fv
  return None


def _captured_main_flags(module) -> flags.FlagValues:
  """The FlagValues `module.main` builds, taken at `errors.parse_flags` (which raises here,
  before the tool does anything)."""
  from common import errors  # pylint: disable=g-import-not-at-top

  def capture(fv, argv, usage=None):
    raise _Captured(fv)

  saved = errors.parse_flags
  errors.parse_flags = capture
  try:
    module.main(["prog"])
  except _Captured as c:
    return c.fv
  finally:
    errors.parse_flags = saved
  raise AssertionError(f"{module.__name__}.main did not parse flags with errors.parse_flags")


# Tools whose flags are built inside main(), before any work.
_MAIN_BUILDS_FLAGS = ("input_pipeline.prepare_hosts",)


def _argparse_options(path: pathlib.Path) -> set[str]:
  """Option names of every `add_argument("--x", ...)` call in a module's source (and in
  bench/harness.py's when the module builds its parser with `harness.parser`)."""
  names = set()
  text = path.read_text(encoding="utf-8")
  if "harness.parser(" in text:
    names |= _argparse_options(ROOT / "bench" / "harness.py")
  for node in ast.walk(ast.parse(text)):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr == "add_argument"):
      for arg in node.args:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and \
            arg.value.startswith("-"):
          names.add(arg.value.lstrip("-"))
  return names


@functools.lru_cache(maxsize=None)
def _flag_spec(module_name: str):
  """('absl', FlagValues-like {name: Flag}) or ('argparse', names) or ('exists', None)."""
  if module_name == "bert_jax.main":
    module = importlib.import_module(module_name)
    by_module = flags.FLAGS.flags_by_module_dict()
    defined = {f.name: f for f in by_module.get(module.__name__, [])}
    assert {"config", "workdir"} <= set(defined), sorted(defined)
    return "absl", defined
  top = module_name.split(".")[0]
  if top in ("bert_jax", "input_pipeline"):
    module = importlib.import_module(module_name)
    fv = (_captured_main_flags(module) if module_name in _MAIN_BUILDS_FLAGS
          else _factory_flags(module))
    if fv is not None:
      return "absl", {name: fv[name] for name in fv}
  if top == "bench":
    spec = importlib.util.find_spec(module_name)
    if spec and spec.origin and "argparse" in pathlib.Path(spec.origin).read_text("utf-8"):
      return "argparse", _argparse_options(pathlib.Path(spec.origin))
  return "exists", None


def _load_config(argv: list[str], lock: bool) -> str | None:
  """Parses `--config=FILE[:ARG]` and its `--config.a.b=value` overrides as the jobs do;
  None when they apply, else what is wrong."""
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_args = []
  for a in argv:
    if a.startswith("--config="):
      file, sep, arg = a[len("--config="):].partition(":")
      path = pathlib.Path(file)
      if not path.is_absolute():
        path = ROOT / path
      if not path.is_file():
        return f"{a}: no config file {path}"
      a = f"--config={path}{sep}{arg}"
    if a.startswith("--config=") or a.startswith("--config."):
      config_args.append(a)
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=lock,
                                  sys_argv=["prog", *config_args])
  try:
    fv(["prog", *config_args])
    fv["config"].value.keys()  # config files load lazily
  except Exception as e:  # pylint: disable=broad-except
    while e.args and isinstance(e.args[0], BaseException):  # ml_collections nests them
      e = e.args[0]
    return f"{' '.join(config_args)}: {type(e).__name__}: {e}"
  return None


def _flag_name(arg: str) -> str:
  return arg.lstrip("-").split("=", 1)[0]


def check_command(module_name: str, args: list[str]) -> list[str]:
  """What is wrong with `python -m MODULE ARGS` (nothing runs): a list of messages."""
  if "$" in module_name:
    return []
  try:
    found = importlib.util.find_spec(module_name)
  except ModuleNotFoundError:
    found = None
  if found is None:
    return [f"no module {module_name}"]
  kind, spec = _flag_spec(module_name)
  if kind == "exists":
    return []
  problems = []
  flag_args = [a for a in args if a.startswith("-")]
  if kind == "argparse":
    for a in flag_args:
      if _flag_name(a) not in spec:
        problems.append(f"{module_name}: no option {a.split('=', 1)[0]}")
    return problems
  has_config = "config" in spec
  config_args = [a for a in flag_args if a.startswith("--config=") or a.startswith("--config.")]
  for a in flag_args:
    if a in config_args and has_config:
      continue
    name = _flag_name(a)
    value = a.split("=", 1)[1] if "=" in a else None
    flag = spec.get(name)
    if flag is None and name.startswith("no") and value is None:
      flag = spec.get(name[2:])
      if flag is not None and not flag.boolean:
        problems.append(f"{module_name}: --{name}: --{name[2:]} is not a boolean flag")
        continue
    if flag is None:
      problems.append(f"{module_name}: no flag --{name}")
      continue
    enum_values = getattr(flag.parser, "enum_values", None)
    if enum_values and value is not None and "$" not in value and value not in enum_values:
      problems.append(f"{module_name}: --{name}={value} is not one of {list(enum_values)}")
  if config_args and has_config:
    config_file = [a for a in config_args if a.startswith("--config=")]
    if not config_file:
      problems.append(f"{module_name}: overrides {config_args} without --config=FILE")
    elif "$" not in config_file[0]:
      error = _load_config(config_args, lock=module_name == "bert_jax.main")
      if error:
        problems.append(f"{module_name}: {error}")
  return problems


_OPERATORS = {"&&", "||", ";", "|"}


def documented_commands(text: str) -> list[tuple[str, list[str], str]]:
  """(module, args, line) of each `python -m MODULE ...` in the ```bash / ```sh blocks."""
  commands = []
  for lang, body in _fenced_blocks(text):
    if lang not in ("bash", "sh", "shell"):
      continue
    for line in body.replace("\\\n", " ").splitlines():
      line = line.strip()
      if not line or line.startswith("#"):
        continue
      tokens = shlex.split(line, comments=True)
      segment: list[str] = []
      for token in [*tokens, ";"]:
        if token not in _OPERATORS:
          segment.append(token)
          continue
        while segment and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", segment[0]):
          segment = segment[1:]  # VAR=value before the command
        if len(segment) >= 3 and segment[0] in ("python", "python3") and segment[1] == "-m":
          args = [t[1:] if t.startswith("[-") else t for t in segment[3:]]
          args = [t[:-1] if t.startswith("-") and t.endswith("]") else t for t in args]
          commands.append((segment[2], args, line))
        segment = []
  return commands


def _all_documented_commands():
  return [(path.relative_to(ROOT).as_posix(), *command)
          for path in _doc_files()
          for command in documented_commands(path.read_text(encoding="utf-8"))]


def test_documented_commands_parse():
  commands = _all_documented_commands()
  modules = {module for _, module, _, _ in commands}
  # The parser found the docs' commands (not nothing).
  assert len(commands) >= 40, len(commands)
  assert {"bert_jax.main", "bert_jax.predict", "bert_jax.convert", "bert_jax.embed_eval",
          "input_pipeline.vocab", "input_pipeline.prepare", "input_pipeline.inspect",
          "input_pipeline.prepare_hosts"} <= modules, sorted(modules)
  problems = [f"{doc}: {p}\n    {line}"
              for doc, module, args, line in commands
              for p in check_command(module, args)]
  assert not problems, "Commands in the docs that no longer parse:\n" + "\n".join(problems)


@pytest.mark.parametrize("module,args,wrong", [
    ("bert_jax.predict", ["--checkpoint=X", "--no_such_flag=1"], "no flag --no_such_flag"),
    ("bert_jax.predict", ["--checkpoint=X", "--mode=no_such_mode"], "not one of"),
    ("bert_jax.predict", ["--nocheckpoint"], "not a boolean flag"),
    ("bert_jax.convert", ["--input=X", "--too=huggingface"], "no flag --too"),
    ("input_pipeline.prepare", ["--input=x", "--vocabulary=v"], "no flag --vocabulary"),
    ("input_pipeline.prepare_hosts", ["--num_host=2"], "no flag --num_host"),
    ("bert_jax.main", ["--config=configs/tiny_pretrain.py", "--work_dir=/tmp/x"],
     "no flag --work_dir"),
    ("bert_jax.main", ["--config=configs/tiny_pretrain.py", "--workdir=/tmp/x",
                       "--config.data.no_such_field=1"], "no_such_field"),
    ("bert_jax.main", ["--config=configs/tiny_pretrain.py",
                       "--config.opt.learning_rate=fast"], "learning_rate"),
    ("bert_jax.main", ["--config=configs/no_such_config.py"], "no config file"),
    ("bert_jax.main", ["--config=configs/base_pretrain.py:no_such_variant"],
     "no_such_variant"),
    ("input_pipeline.inspect", ["--config=configs/tiny_pretrain.py",
                                "--config.data.no_such_field=1"], "no_such_field"),
    ("bench.accel.profile_step", ["--no_such_option=1"], "no option --no_such_option"),
    ("bert_jax.no_such_module", [], "no module"),
])
def test_the_checker_rejects_what_does_not_parse(module, args, wrong):
  problems = check_command(module, args)
  assert any(wrong in p for p in problems), problems


def test_the_checker_accepts_what_parses():
  assert check_command("bert_jax.main", [
      "--config=configs/suite.py:glue", "--config.init_checkpoint=CKPT",
      "--config.task_dirs.cola=DIR", "--workdir=/tmp/x", "--multihost"]) == []
  assert check_command("bert_jax.predict", ["--checkpoint=X", "--mode=classify",
                                            "--nolowercase"]) == []
  assert check_command("bench.accel.scaling_table", ["--json", "/tmp/x.json"]) == []
  commands = documented_commands(
      "```bash\n# a comment\nHF=x  # the model\npip install -e . && python -m bert_jax.main "
      "\\\n  --config=configs/base_pretrain.py [--config.seed=3]  # note\n```\n")
  assert commands == [("bert_jax.main", ["--config=configs/base_pretrain.py",
                                         "--config.seed=3"],
                       "pip install -e . && python -m bert_jax.main "
                       "   --config=configs/base_pretrain.py [--config.seed=3]  # note")]


# --------------------------------------------------------------------------------------
# (c) every module is in its table


def _table_rows(path: pathlib.Path) -> list[str]:
  return [l for l in path.read_text(encoding="utf-8").splitlines() if l.startswith("|")]


def _modules(directory: str) -> list[str]:
  return sorted(p.name for p in (ROOT / directory).glob("*.py") if p.name != "__init__.py")


def test_every_module_is_in_a_table():
  rows = _table_rows(README) + _table_rows(ROOT / "docs" / "architecture.md")
  text = "\n".join(rows)
  missing = [f"bert_jax/{m}" for m in _modules("bert_jax") if f"`bert_jax/{m}`" not in text]
  missing += [f"bert_jax/models/{m}" for m in _modules("bert_jax/models")
              if f"`bert_jax/models/{m}`" not in text]
  config_rows = "\n".join(r for r in rows if "`configs/`" in r or "`bert_jax/configs/`" in r)
  missing += [f"bert_jax/configs/{m}" for m in _modules("bert_jax/configs")
              if f"`{m}`" not in config_rows and f"`configs/{m}`" not in text]
  missing += [f"common/{m}" for m in _modules("common") if f"`common/{m}`" not in text]
  pipeline = "\n".join(_table_rows(ROOT / "input_pipeline" / "README.md"))
  missing += [f"input_pipeline/{m}" for m in _modules("input_pipeline")
              if f"`{m}`" not in pipeline]
  benches = "\n".join(_table_rows(ROOT / "bench" / "README.md"))
  missing += [f"bench/{m}" for m in [*_modules("bench"), *(p.relative_to(ROOT / "bench").as_posix()
                                                         for p in sorted((ROOT / "bench").glob("*/*.py")))]
              if f"`{m}`" not in benches]
  assert not missing, ("Modules in no table (README.md's or docs/architecture.md's for "
                       "bert_jax and common, bench/README.md's for bench, input_pipeline/README.md's for input_pipeline): "
                       + ", ".join(missing))


# --------------------------------------------------------------------------------------
# links


def _anchor(heading: str) -> str:
  """GitHub's anchor of a heading."""
  text = re.sub(r"[`*_\[\]()]", "", heading.strip().lower())
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


def _anchors(path: pathlib.Path) -> set[str]:
  text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
  return {_anchor(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}


def test_relative_links_resolve():
  broken = []
  bench = ROOT / "bench"
  for path in [*_doc_files(), bench / "README.md", bench / "RESULTS.md"]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
      if re.match(r"[a-z]+:", target):
        continue
      file, _, anchor = target.partition("#")
      dest = (path.parent / file).resolve() if file else path
      if not dest.exists():
        broken.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
      elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
        broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
  assert not broken, "\n".join(broken)
