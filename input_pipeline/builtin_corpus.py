"""The built-in corpus: documentation every Python install carries, no download needed.

Documents (in this order, deterministic for a given Python build):
  * one per standard-library module and public submodule (sorted by name): the module docstring followed by the docstrings of
    its public classes, functions and methods (sorted by name);
  * one per `pydoc_data.topics.topics` entry (the language reference topics `help()` shows).
About 4-6 MB of English text on CPython 3.11, enough to train a small vocabulary and to
pre-train tiny models in tests and demos.

Modules are imported in a child interpreter so that import side effects (printing,
opening windows, changing global state) never reach the caller; modules that cannot be
imported, that have side effects (`this`, `antigravity`), need a GUI (`tkinter`,
`turtle`, `idlelib`) or are test packages are skipped.
"""
import functools
import json
import subprocess
import sys

SKIP_MODULES = frozenset({
    "this", "antigravity", "idlelib", "tkinter", "turtle", "turtledemo", "test",
    "lib2to3", "ensurepip", "venv", "xxlimited", "xxlimited_35", "xxsubtype",
    "__hello__", "__phello__", "pydoc_data",
})

_COLLECT = r'''
import importlib, inspect, io, json, pkgutil, sys, warnings
warnings.simplefilter("ignore")
skip = set(json.loads(sys.argv[1]))
top = sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in skip)
out = sys.stdout
sys.stdout = sys.stderr = io.StringIO()  # Swallow anything an import prints.
docs = []


def doc_of(obj):
  doc = obj.__doc__ if isinstance(getattr(obj, "__doc__", None), str) else None
  return inspect.cleandoc(doc) if doc else ""


def public_submodules(package):
  """Sorted public submodules of a package, without test packages."""
  found = []
  for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".",
                                    onerror=lambda _: None):
    parts = info.name.split(".")
    if not any(p.startswith("_") or p.startswith("test") or p in skip for p in parts):
      found.append(info.name)
  return sorted(found)


def modules():
  for name in top:
    try:
      module = importlib.import_module(name)
    except BaseException:
      continue
    yield name, module
    for sub in public_submodules(module) if hasattr(module, "__path__") else []:
      try:
        yield sub, importlib.import_module(sub)
      except BaseException:
        continue


for name, module in modules():
  parts = [doc_of(module)]
  for attr in sorted(vars(module)):
    obj = vars(module)[attr]
    if attr.startswith("_") or getattr(obj, "__module__", None) != name:
      continue
    if not (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj)):
      continue
    parts.append(doc_of(obj))
    if inspect.isclass(obj):
      for meth in sorted(vars(obj)):
        if not meth.startswith("_") and callable(vars(obj)[meth]):
          parts.append(doc_of(vars(obj)[meth]))
  text = "\n\n".join(p for p in parts if p)
  if text:
    docs.append(["module:" + name, text])

from pydoc_data.topics import topics
for topic in sorted(topics):
  docs.append(["topic:" + topic, topics[topic]])
out.write(json.dumps(docs))
'''


@functools.lru_cache(maxsize=1)
def builtin_texts() -> tuple[tuple[str, str], ...]:
  """(name, text) pairs of the built-in corpus, collected in a child interpreter."""
  # -I (isolated): ignore PYTHON* variables and the user site, for determinism.
  result = subprocess.run(
      [sys.executable, "-I", "-c", _COLLECT, json.dumps(sorted(SKIP_MODULES))],
      capture_output=True, timeout=300, check=False, stdin=subprocess.DEVNULL)
  if result.returncode != 0:
    raise RuntimeError("Collecting the built-in corpus failed:\n"
                       + result.stderr.decode(errors="replace")[-2000:])
  return tuple((name, text) for name, text in json.loads(result.stdout))


def _paragraphs(text: str) -> list[str]:
  """Blank-line separated paragraphs with their lines joined (docstrings are wrapped)."""
  paragraphs = []
  for block in text.replace("\r\n", "\n").split("\n\n"):
    joined = " ".join(line.strip() for line in block.split("\n") if line.strip())
    if joined:
      paragraphs.append(joined)
  return paragraphs


def iter_builtin_documents(stats: dict):
  """Raw documents ({"texts": paragraphs, "split": True}) of the built-in corpus."""
  for _, text in builtin_texts():
    stats["bytes"] += len(text.encode("utf-8"))
    paragraphs = _paragraphs(text)
    if paragraphs:
      yield {"texts": paragraphs, "split": True}
