"""The five sources added for issue 25: what the format cannot replay is re-derived here,
and the wrong claims' roots are the ones the sources' own text shows.

(The truth of every claim is recomputed independently in tests/test_books.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tomllib

from mha_symbolic.textbook import check_examples, load_examples

BOOKS = Path(__file__).resolve().parents[2] / "examples" / "books"
NEW = ["karim-illustrated-self-attention", "cristina-mlm-attention-from-scratch",
       "karpathy-lets-build-gpt", "raschka-self-attention-blog", "asad-grad-chronicles-mha"]


@pytest.fixture(scope="module")
def reports():
    return {n: check_examples(load_examples(BOOKS / f"{n}.toml")) for n in NEW}


def test_mlm_weights_are_the_numpy_draws() -> None:
    # the tutorial: random.seed(42); W_Q, W_K, W_V = random.randint(3, size=(3, 3)) × 3,
    # replayed by the file's [example.init]; numpy's global API draws them again here
    doc = tomllib.loads((BOOKS / "cristina-mlm-attention-from-scratch.toml").read_text("utf-8"))
    assert doc["example"][0]["init"]["numpy_seed"] == 42
    ex = load_examples(BOOKS / "cristina-mlm-attention-from-scratch.toml")[0]
    np.random.seed(42)
    for key in ("w_q", "w_k", "w_v"):
        assert np.random.randint(3, size=(3, 3)).tolist() == ex.inputs[key]
    # and the matrices the tutorial's run gives (written out by hand before the replay)
    assert ex.inputs["w_q"] == [[2, 0, 2], [2, 0, 0], [2, 1, 2]]
    assert ex.inputs["w_v"] == [[1, 1, 0], [0, 1, 1], [0, 0, 0]]


def test_the_new_sources_are_right_except_karims_rounding(reports) -> None:
    for name, report in reports.items():
        wrong = [r for r in report.records if r.verdict == "wrong"]
        assert bool(wrong) == (name == "karim-illustrated-self-attention"), (name, wrong)
        assert not [r for r in report.records if r.verdict == "unreadable"], name


def test_karim_roots(reports) -> None:
    """Karim rounds the softmax of (2, 4, 4) = (0.0634, 0.4683, 0.4683) to (0.0, 0.5, 0.5)
    so the row sums to 1 (correct rounding: (0.1, 0.5, 0.5)), then blends the values with
    the rounded weights.  Rows 2 and 3 are correct roundings, so their outputs are premature
    rounding; row 1's output is downstream of the nudged weights."""
    by = {(r.quantity, r.claimed[:12]): r for r in reports["karim-illustrated-self-attention"].records}
    wrong = [r for r in reports["karim-illustrated-self-attention"].records if r.verdict == "wrong"]
    assert len(wrong) == 8 and all(r.diagnosis for r in wrong)
    assert by[("weight[1]", "[0.0, 0.5, 0")].diagnosis.startswith("rounded so that each row sums to 1")
    assert by[("head_output[1]", "[2.0, 7.0, 1")].diagnosis.startswith("follows from wrong printed")
    assert "rounded so that each row sums to 1" in by[("head_output[1]", "[2.0, 7.0, 1")].diagnosis
    for q in ("head_output[2]", "head_output[3]", "weighted_value[1,2]", "weighted_value[1,3]"):
        rec = next(r for r in wrong if r.quantity == q)
        assert rec.diagnosis.startswith("premature rounding"), (q, rec.diagnosis)
    # the exact softmax printed in the code's comment and the unrounded outputs hold
    assert all(r.ok for r in reports["karim-illustrated-self-attention"].records
               if r.claimed.startswith("tensor("))


def test_raschka_heads_first_shapes(reports) -> None:
    recs = reports["raschka-self-attention-blog"].records
    assert [r.verdict for r in recs].count("ambiguous") == 1   # the one written without axes
    assert all(r.ok for r in recs if r.verdict != "ambiguous")
    assert reports["raschka-self-attention-blog"].exit_status == 4


def test_embedding_rows_are_what_torch_looks_up() -> None:
    torch = pytest.importorskip("torch")
    from mha_symbolic.textbook.seeded import draw

    torch.manual_seed(123)
    embedded = torch.nn.Embedding(6, 16)(torch.tensor([0, 4, 5, 2, 1, 3])).detach().numpy()
    torch.manual_seed(123)
    w = torch.rand(24, 16).numpy()
    got = draw({"torch_seed": 123, "draws": ["x = Embedding(6, 16)[0, 4, 5, 2, 1, 3]",
                                             "seed(123)", "w_q = rand(24, 16)"]})
    assert got["x"].tobytes() == embedded.tobytes() and got["w_q"].tobytes() == w.tobytes()


@pytest.mark.parametrize("bad", ["x = Embedding(6, 16)[6]", "w_q = Embedding(6, 16)[0]",
                                 "x = Embedding(6, 16)[]"])
def test_bad_embedding_draws_are_refused(bad: str) -> None:
    from mha_symbolic.errors import ExampleFileError
    from mha_symbolic.textbook.seeded import parse_draw

    with pytest.raises(ExampleFileError):
        parse_draw(bad)
