"""Fine-tuning metrics against hand-computed cases."""
import pytest

from bert_jax import scoring


def test_accuracy_and_f1():
  assert scoring.accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
  # tp=2, fp=1, fn=1 -> P=R=2/3 -> F1=2/3
  assert scoring.f1_binary([1, 1, 1, 0, 0], [1, 1, 0, 1, 0]) == pytest.approx(2 / 3)
  assert scoring.f1_binary([0, 0], [0, 0]) == 0.0


def test_matthews_correlation():
  # TP=1 FP=1 TN=2 FN=0: (1*2 - 1*0) / sqrt(2*1*3*2)
  assert scoring.matthews_corrcoef([1, 1, 0, 0], [1, 0, 0, 0]) == pytest.approx(0.5773503)
  assert scoring.matthews_corrcoef([1, 0, 1, 0], [1, 0, 1, 0]) == pytest.approx(1.0)
  assert scoring.matthews_corrcoef([1, 0, 1, 0], [0, 1, 0, 1]) == pytest.approx(-1.0)
  assert scoring.matthews_corrcoef([1, 1, 1], [1, 0, 1]) == 0.0  # constant prediction


def test_pearson_and_spearman_with_ties():
  assert scoring.pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(0.9933993)
  # ranks x=[1,2.5,2.5,4], y=[1,3,2,4] -> 4.5 / sqrt(4.5 * 5)
  assert scoring.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(0.9486833)


def test_squad_v1_normalisation_em_and_f1():
  assert scoring.normalize_answer("The  Cat, sat!") == "cat sat"
  assert scoring.exact_match("the cat sat", "A cat sat.") == 1.0
  # "cat sat" vs "cat sat down": P=1, R=2/3
  assert scoring.span_f1("the cat sat", "a cat sat down") == pytest.approx(0.8)
  scores = scoring.squad_scores({"q1": "Paris", "q2": "in London"},
                                {"q1": ["Paris", "paris, France"], "q2": ["Berlin", "London"]})
  assert scores["exact"] == pytest.approx(50.0)
  assert scores["f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)  # "in london" vs "london"


def test_squad_v2_no_answer_breakdown_and_threshold():
  preds = {"q1": "Paris", "q2": "London", "q3": ""}
  golds = {"q1": ["Paris"], "q2": [], "q3": [""]}
  na = {"q1": 0.1, "q2": 0.9, "q3": 0.5}
  s = scoring.squad_scores(preds, golds, na_probs=na)
  assert s["exact"] == pytest.approx(200 / 3)
  assert (s["HasAns_total"], s["NoAns_total"]) == (1, 2)
  assert s["HasAns_exact"] == 100.0 and s["NoAns_exact"] == 50.0
  # Start: all no-answer -> 2/3 right; q1 (0.1) answered -> 3/3: threshold 0.1.
  assert s["best_exact"] == pytest.approx(100.0) and s["best_exact_thresh"] == 0.1


def test_ner_entities_iob2_and_iob1():
  assert scoring.get_entities(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]
  # IOB1: I starts a chunk; B only separates two adjacent chunks of one type.
  assert scoring.get_entities(["I-PER", "I-PER", "B-PER", "O", "I-LOC"]) == [
      ("PER", 0, 1), ("PER", 2, 2), ("LOC", 4, 4)]
  s = scoring.ner_scores([["B-PER", "I-PER", "O", "B-ORG"]], [["B-PER", "I-PER", "O", "B-LOC"]])
  assert s == pytest.approx({"precision": 0.5, "recall": 0.5, "f1": 0.5})
  # A partially matched span counts as wrong.
  s = scoring.ner_scores([["B-PER", "O"]], [["B-PER", "I-PER"]])
  assert s["f1"] == 0.0
