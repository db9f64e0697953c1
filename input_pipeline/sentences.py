"""Rule-based English sentence splitting (no TensorFlow: prepare workers import this)."""
import re

# Words that end with a full stop without ending the sentence (compared lowercased,
# without the final full stop). "etc." is left out: it ends sentences as often as not.
ABBREVIATIONS = frozenset("""
mr mrs ms messrs mme mlle dr prof st sr jr rev hon gov gen col capt lt sgt cmdr adm maj
mt ft vs cf ca approx dept est inc ltd co corp bros jan feb mar apr jun jul aug sep sept
oct nov dec mon tue wed thu fri sat sun e.g i.e viz al ed eds trans
""".split())
# Abbreviations only before a number ("No. 5", "Vol. 2"); otherwise ordinary words ("No.").
NUMBER_ABBREVIATIONS = frozenset("no nos vol vols pp ch fig figs eq eqs sec art op".split())

# A boundary: sentence punctuation, optional closing quotes/brackets, whitespace, then
# (after optional opening quotes/brackets) an upper-case letter or a digit.
_BOUNDARY = re.compile(r"[.!?…]+[\"'”’)\]]*\s+(?=[\"'“‘(\[]*[^\W_a-z])")
_INITIAL = re.compile(r"[^\W\d_]")                  # "J." in "J. R. R. Tolkien"
_DOTTED = re.compile(r"(?:[^\W\d_]\.)+[^\W\d_]")    # "e.g", "U.S", "i.e"


def _is_abbreviation(text: str, stop: int, next_char: str) -> bool:
  """Whether the full stop at text[stop] ends an abbreviation, not a sentence."""
  start = stop
  while start > 0 and not text[start - 1].isspace() and text[start - 1] not in "(\"'“‘[":
    start -= 1
  word = text[start:stop]
  if not word:
    return False
  word = word.lower()
  return (word in ABBREVIATIONS or (word in NUMBER_ABBREVIATIONS and next_char.isdigit())
          or bool(_INITIAL.fullmatch(word)) or bool(_DOTTED.fullmatch(word)))


def split_sentences(paragraph: str) -> list[str]:
  """Rule-based sentence splitter for English prose.

  Splits after . ! ? or an ellipsis (plus closing quotes/brackets) when whitespace and an
  upper-case letter or digit follow; a full stop after a known abbreviation ("Mr.",
  "e.g."), a single initial ("J.") or a dotted acronym ("U.S.") does not split. Decimals
  ("3.14") never split since no whitespace follows the point. Lower-case after a quote
  ('"Stop!" he said.') continues the sentence.
  """
  sentences, start = [], 0
  for match in _BOUNDARY.finditer(paragraph):
    punct = match.group(0).rstrip()
    if punct[0] == "." and len(punct.rstrip("\"'”’)]")) == 1 and _is_abbreviation(
        paragraph, match.start(), paragraph[match.end()]):
      continue
    sentence = paragraph[start:match.end()].strip()
    if sentence:
      sentences.append(sentence)
    start = match.end()
  rest = paragraph[start:].strip()
  if rest:
    sentences.append(rest)
  return sentences


def document_sentences(doc: dict) -> list[str]:
  """Raw document -> its sentences."""
  if not doc["split"]:
    return list(doc["texts"])
  return [s for paragraph in doc["texts"] for s in split_sentences(paragraph)]
