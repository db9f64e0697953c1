"""The package's layering, read from the source (no imports run, so it is fast):

- module-level imports among bert_jax/, bert_jax/configs/ and input_pipeline/ form no cycle, so
  every module imports on its own;
- no function-local import of a project module (only optional heavy dependencies such as
  torch or tensorflow may be imported inside a function);
- loading a config file imports nothing that imports TensorFlow or JAX;
- model <- heads <- formats <- loader <- checkpointing <- objectives <- registry <- trainer <-
  convert (the CLI) <- jobs <- suite <- main: lower layers never import higher ones; input_pipeline imports nothing of bert_jax;
  common (errors, the path layer, the directory lock) imports neither;
- files are read through the path layer (no tf.io.gfile), and only the entry point takes the
  workdir's lock;
- no module over 600 lines and no function over 60, in the packages and in bench/.
"""
import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("bert_jax", "bert_jax.configs", "bert_jax.models", "input_pipeline", "common")


def _modules() -> dict[str, pathlib.Path]:
  out = {}
  for package in PACKAGES:
    for path in sorted((REPO / package.replace(".", "/")).glob("*.py")):
      name = package if path.stem == "__init__" else f"{package}.{path.stem}"
      out[name] = path
  return out


def _imports(tree: ast.AST, modules) -> list[tuple[str, bool]]:
  """(imported name, at module level?) of every import in `tree`."""
  found = []
  top = {id(n) for n in tree.body}

  def visit(node, top_level):
    for child in ast.iter_child_nodes(node):
      level = top_level and (id(child) in top or isinstance(node, (ast.If, ast.Try)))
      if isinstance(child, ast.Import):
        found.extend((a.name, level) for a in child.names)
      elif isinstance(child, ast.ImportFrom) and child.module:
        for a in child.names:
          full = f"{child.module}.{a.name}"
          found.append((full if full in modules else child.module, level))
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        visit(child, False)
      elif isinstance(child, ast.ClassDef):
        visit(child, top_level)
      else:
        visit(child, level)

  visit(tree, True)
  return found


def _graph():
  modules = _modules()
  graph, local, external = {}, {}, {}
  for name, path in modules.items():
    found = _imports(ast.parse(path.read_text()), modules)
    graph[name] = sorted({m for m, top in found if top and m in modules and m != name})
    local[name] = sorted({m for m, top in found if not top and m.split(".")[0] in ("bert_jax", "input_pipeline", "common")})
    external[name] = sorted({m.split(".")[0] for m, top in found if top and m not in modules})
  return modules, graph, local, external


def _closure(graph, start):
  seen, stack = set(), [start]
  while stack:
    for m in graph[stack.pop()]:
      if m not in seen:
        seen.add(m)
        stack.append(m)
  return seen


def test_no_import_cycles():
  _, graph, _, _ = _graph()
  cycles = [m for m in graph if m in _closure(graph, m)]
  assert not cycles, {m: graph[m] for m in cycles}


def test_no_function_local_imports_of_project_modules():
  _, _, local, _ = _graph()
  assert not {m: l for m, l in local.items() if l}


def test_configs_import_no_tensorflow_or_jax():
  _, graph, _, external = _graph()
  for name in graph:
    if name.startswith("bert_jax.configs."):
      heavy = {x for m in _closure(graph, name) | {name} for x in external[m]} & {"tensorflow", "jax"}
      assert not heavy, (name, heavy)


def test_layers_import_downward_only():
  _, graph, _, _ = _graph()
  order = ["bert_jax.models.layers", "bert_jax.models.bert_attention", "bert_jax.models.bert",
           "bert_jax.models.modern_attention", "bert_jax.models.modern", "bert_jax.heads",
           "bert_jax.models.bert_tf_checkpoint", "bert_jax.formats",
           "bert_jax.models.bert_formats", "bert_jax.models.modern_formats", "bert_jax.loader",
           "bert_jax.checkpointing", "bert_jax.objectives", "bert_jax.registry",
           "bert_jax.tasks", "bert_jax.trainer", "bert_jax.convert", "bert_jax.train", "bert_jax.finetune",
           "bert_jax.suite_report", "bert_jax.suite", "bert_jax.main"]
  for i, low in enumerate(order):
    above = set(order[i + 1:])
    assert not (_closure(graph, low) & above), (low, _closure(graph, low) & above)
  # Each family's FLOP formula lives in its own module: flops counts through the Family record
  # and imports no model module but the shared layers (issue 59).
  assert _closure(graph, "bert_jax.flops") & {m for m in graph if m.startswith("bert_jax.models.")} \
      <= {"bert_jax.models.layers"}, graph["bert_jax.flops"]
  # The input pipeline knows nothing of the trainer side; what both share (errors, the path
  # layer, the directory lock) lies below both and imports neither.
  for name in graph:
    if name.startswith("input_pipeline"):
      used = {m for m in _closure(graph, name) if m.startswith("bert_jax")}
      assert not used, (name, used)
    if name.startswith("common"):
      used = {m for m in _closure(graph, name) if not m.startswith("common")}
      assert not used, (name, used)


def test_paths_go_through_the_path_layer_and_the_lock_is_taken_once():
  modules = _modules()
  for name, path in modules.items():
    text = path.read_text()
    if name != "common.fileio":  # the path layer (its docstring names its backend)
      assert "tf.io.gfile" not in text and "gfile." not in text, name
    if name not in ("bert_jax.main", "bert_jax.workdir_lock"):  # its docstring shows the use
      assert "workdir_lock.hold(" not in text, name  # main.run holds it for every job


def _bench_modules() -> dict[str, pathlib.Path]:
  """Every module under bench/ (its groups' subpackages too)."""
  return {".".join(p.relative_to(REPO).with_suffix("").parts): p
          for p in sorted((REPO / "bench").rglob("*.py"))}


def test_no_module_over_600_lines_and_no_function_over_60():
  """Files that hold one thing, functions that do one thing (issue 39's limits), in the
  packages and in bench/ (issue 59)."""
  long_files, long_functions = [], []
  bench = _bench_modules()
  assert "bench.harness" in bench and len(bench) >= 20, sorted(bench)
  for name, path in {**_modules(), **bench}.items():
    text = path.read_text()
    if text.count("\n") > 600:
      long_files.append((name, text.count("\n")))
    for node in ast.walk(ast.parse(text)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        length = node.end_lineno - node.lineno + 1
        if length > 60:
          long_functions.append((name, node.name, length))
  assert not long_files and not long_functions, (long_files, long_functions)
