"""Inputs as books give them (mha_symbolic.textbook.inputs, .arrays, .seeded): a batch
dimension, fused and per-head projections, torch's (out, in) layout, masked_fill masks,
valid lengths, per-head masks, .npy/.npz files and seeded initialisers.

Every expected number is computed here by hand with Fractions and mpmath (60 digits);
the same example written two ways (fused and split, torch layout and book layout, …) must
give the same exact values.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import mpmath
import numpy as np
import pytest

from mha_symbolic.errors import ExampleFileError
from mha_symbolic.textbook import check_examples, load_examples

mp = mpmath.mp
mp.dps = 60
F = Fraction


def one(text: str, **kw: Any) -> Any:
    (r,) = check_examples(load_examples(text=text, **kw)).records
    return r


def claim(quantity: str, claimed: str, **extra: Any) -> str:
    lines = ["[[example.claim]]", f"quantity = {json.dumps(quantity)}",
             f"claimed = {json.dumps(claimed)}"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


X = [[1, 0], [0, 2]]
WQ = [[1, 2], [3, 4]]  # (in, out)
WK = [[0, 1], [1, 0]]
WV = [[2, 0], [0, 1]]


def base(**keys: Any) -> str:
    return "[[example]]\nname = 'E'\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())


def test_batch_dimension_one_engine_call_per_element() -> None:
    # batch element 2: x = [[0, 2], [1, 0]]; q = x W_Q = [[6, 8], [1, 2]]; k = x W_K = [[2, 0], [0, 1]]
    # raw scores of element 2: q k^T = [[12, 8], [2, 2]]
    text = base(x=[X, [[0, 2], [1, 0]]], w_q=WQ, w_k=WK, w_v=WV, scale=1)
    assert one(text + claim("score[1,1]", "12", batch=2)).verdict == "exact"
    assert one(text + claim("dim.batch", "2")).verdict == "exact"
    assert one(text + claim("shape.x", "torch.Size([2, 2, 2])")).verdict == "exact"
    r = one(text + claim("score", "tensor([[[2, 4], [8, 12]], [[12, 8], [2, 2]]])"))
    # element 1: q = [[1, 2], [6, 8]], k = [[0, 1], [2, 0]] → [[2, 2], [8, 12]]… written by hand:
    q1 = [[1, 2], [6, 8]]
    k1 = [[0, 1], [2, 0]]
    s1 = [[sum(a * b for a, b in zip(qr, kr, strict=True)) for kr in k1] for qr in q1]
    assert s1 == [[2, 2], [8, 12]]
    assert r.verdict == "wrong" and r.entries[0]["index"] == "[1,1,2]"  # 4 claimed for 2
    r = one(text + claim("score", "tensor([[[2, 2], [8, 12]], [[12, 8], [2, 2]]])"))
    assert r.verdict == "exact"


def test_a_stated_batch_must_agree_with_the_inputs() -> None:
    with pytest.raises(ExampleFileError, match="batch=3"):
        load_examples(text=base(x=[X, X], w_q=WQ, w_k=WK, w_v=WV, batch=3))


def test_torch_layout_transposes_the_weights() -> None:
    book = base(x=X, w_q=WQ, w_k=WK, w_v=WV)
    torch = base(x=X, w_q=[list(c) for c in zip(*WQ, strict=True)],
                 w_k=[list(c) for c in zip(*WK, strict=True)],
                 w_v=[list(c) for c in zip(*WV, strict=True)], layout="torch")
    a, b = load_examples(text=book)[0], load_examples(text=torch)[0]
    assert a.attention().heads[0].weights == b.attention().heads[0].weights
    assert one(torch + claim("shape.w_q", "2 × 2")).verdict == "exact"


def test_weights_pasted_in_torch_layout_are_diagnosed() -> None:
    # the text used W_Q, W_K as given; the file holds them transposed (book layout read
    # as torch's): the claimed score is x W_Q (x W_K)^T, which the transposition reproduces
    q = [[sum(X[i][t] * WQ[t][j] for t in range(2)) for j in range(2)] for i in range(2)]
    k = [[sum(X[i][t] * WK[t][j] for t in range(2)) for j in range(2)] for i in range(2)]
    s11 = sum(a * b for a, b in zip(q[0], k[0], strict=True))
    pasted = base(x=X, w_q=[list(c) for c in zip(*WQ, strict=True)],
                  w_k=[list(c) for c in zip(*WK, strict=True)], w_v=WV, scale=1)
    r = one(pasted + claim("score[1,1]", str(s11)))
    assert r.verdict == "wrong" and "transposed" in (r.diagnosis or "")
    assert "layout" in (r.diagnosis or "")


def test_fused_qkv_stacked_and_per_head_equal_the_split_weights() -> None:
    # heads = 2, d = 1: W_Q = [[1, 2], [3, 4]] (columns: head 1, head 2), W_K, W_V likewise
    split = base(x=X, w_q=WQ, w_k=WK, w_v=WV, heads=2)
    stacked = [[a[0], a[1], b[0], b[1], c[0], c[1]] for a, b, c in zip(WQ, WK, WV, strict=True)]
    per_head = [[a[0], b[0], c[0], a[1], b[1], c[1]] for a, b, c in zip(WQ, WK, WV, strict=True)]
    ex0 = load_examples(text=split)[0].attention()
    for w_qkv, layout in ((stacked, "stacked"), (per_head, "per_head")):
        ex = load_examples(text=base(x=X, w_qkv=w_qkv, heads=2, qkv_layout=layout))[0]
        assert ex.attention().concat == ex0.concat, layout
    assert one(base(d_model=32, heads=1) + claim("shape.w_qkv", "32 × 96")).verdict == "exact"


def test_per_head_weight_lists_are_put_side_by_side() -> None:
    per_head = base(x=X, w_q=[[[1], [3]], [[2], [4]]], w_k=[[[0], [1]], [[1], [0]]],
                    w_v=[[[2], [0]], [[0], [1]]], heads=2)
    assert load_examples(text=per_head)[0].attention().concat == \
        load_examples(text=base(x=X, w_q=WQ, w_k=WK, w_v=WV, heads=2))[0].attention().concat


def test_bias_flag_per_projection_and_the_count() -> None:
    # 768 wide, 12 heads, biases on the output projection only: 4 · 768² + 768
    text = base(d_model=768, heads=12) + "bias = { q = false, k = false, v = false, o = true }\n"
    assert one(text + claim("params.total", "2,360,064")).verdict == "exact"
    assert 4 * 768**2 + 768 == 2360064
    r = one(text + claim("params.total", str(4 * 768**2 + 4 * 768)))
    assert r.verdict == "wrong" and "counts biases on q, k, v, o" in (r.diagnosis or "")
    assert "o only" in (r.diagnosis or "")


def test_gqa_counted_as_mha_is_diagnosed() -> None:
    # 4096 wide, 32 heads, 8 kv heads, no bias: GQA 2·4096² + 2·4096·1024; MHA 4·4096²
    text = base(d_model=4096, heads=32, kv_heads=8, bias=False)
    assert one(text + claim("params.total", "41,943,040")).verdict == "exact"
    assert 2 * 4096**2 + 2 * 4096 * 1024 == 41943040
    r = one(text + claim("params.total", str(4 * 4096**2)))
    assert r.verdict == "wrong" and "kv_heads=8 ignored" in (r.diagnosis or "")


def test_stacked_projection_shape_versus_per_head() -> None:
    text = base(d_model=100, heads=5)
    assert one(text + claim("shape.w_q_stacked", "100 × 100")).verdict == "exact"
    assert one(text + claim("shape.w_q", "100 × 20")).verdict == "exact"
    r = one(text + claim("shape.w_q", "100 × 100"))
    assert r.verdict == "wrong"
    gqa = base(d_model=4096, heads=32, kv_heads=8, layout="torch")
    assert one(gqa + claim("shape.w_k_stacked", "torch.Size([1024, 4096])")).verdict == "exact"


def test_masked_fill_replaces_the_scores() -> None:
    # scores (0, 1, 2) at scale 1; key 3 masked and filled with -5: weights e^0, e^1, e^-5 over their sum
    text = base(scores=[[0, 1, 2]], scale=1, masked=[[False, False, True]], mask_fill=-5)
    w3 = mpmath.exp(-5) / (1 + mpmath.e + mpmath.exp(-5))
    assert mpmath.nstr(w3, 6) == "0.00180884"
    assert one(text + claim("weight[1,3]", "0.0018088")).verdict == "correctly rounded"
    assert one(text + claim("scaled_score[1,3]", "-5")).verdict == "exact"
    removed = base(scores=[[0, 1, 2]], scale=1, masked=[[False, False, True]])
    assert one(removed + claim("weight[1,3]", "0")).verdict == "exact"


def test_masked_fill_on_the_raw_scores_is_scaled() -> None:
    # fill -4 before scaling by 1/2: the scaled score is -2
    text = base(scores=[[0, 1]], scale=F(1, 2).__str__(), masked=[[False, True]], mask_fill=-4,
                mask_fill_stage="raw")
    assert one(text + claim("scaled_score[1,2]", "-2")).verdict == "exact"


def test_valid_lens_mask_keys_per_batch_element() -> None:
    text = base(scores=[[[0, 0, 0]], [[0, 0, 0]]], scale=1, valid_lens=[1, 2])
    assert one(text + claim("weight[1]", "(1, 0, 0)")).verdict == "exact"
    assert one(text + claim("weight[1]", "(1/2, 1/2, 0)", batch=2)).verdict == "exact"


def test_per_head_additive_masks_alibi() -> None:
    # two heads, same scores (0, 0); biases (0, -1) for head 1 and (0, -2) for head 2
    text = base(scores=[[[0, 0]], [[0, 0]]], heads=2, scale=1, mask=[[[0, -1]], [[0, -2]]])
    w1 = 1 / (1 + mpmath.exp(-1))
    w2 = 1 / (1 + mpmath.exp(-2))
    assert mpmath.nstr(w1, 5) == "0.73106" and mpmath.nstr(w2, 5) == "0.8808"
    assert one(text + claim("weight[1,1]", "0.7311")).verdict == "correctly rounded"
    assert one(text + claim("weight[1,1]", "0.8808", head=2)).verdict == "correctly rounded"


def test_inputs_from_npy_and_npz_beside_the_file(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.array(X, dtype=np.float32))
    np.savez(tmp_path / "w.npz", w_q=np.array(WQ), w_k=np.array(WK), w_v=np.array(WV))
    f = tmp_path / "e.toml"
    f.write_text("[[example]]\nname = 'E'\nx = 'x.npy'\narrays = 'w.npz'\nscale = 1\n"
                 + claim("score[2,2]", "16"), encoding="utf-8")
    # q_2 = (0, 2) W_Q = (6, 8); k_2 = (0, 2) W_K = (2, 0): 12 … no: (6, 8)·(2, 0) = 12
    assert sum(a * b for a, b in zip((6, 8), (2, 0), strict=True)) == 12
    (r,) = check_examples(load_examples(f)).records
    assert r.verdict == "wrong" and r.exact == "12"
    # float arrays are taken at their exact binary values: float32(0.1) is not 1/10
    np.save(tmp_path / "s.npy", np.array([[0.1, 0.0]], dtype=np.float32))
    g = tmp_path / "s.toml"
    g.write_text("[[example]]\nname = 'S'\nscores = 's.npy'\nscale = 1\n"
                 + claim("score[1,1]", "0.1"), encoding="utf-8")
    (r,) = check_examples(load_examples(g)).records
    assert F(*float(np.float32(0.1)).as_integer_ratio()) != F(1, 10)
    assert r.verdict == "correctly rounded"


@pytest.mark.parametrize(("ref", "message"), [
    ("../outside.npy", "inside the worked example's folder"),
    ("/etc/passwd", "inside the worked example's folder"),
    ("missing.npy", "no such file"),
    ("notes.txt", "not a .npy or .npz"),
    ("obj.npy", "allow_pickle=False"),
    ("link.npy", "leads outside"),
])
def test_file_inputs_are_confined_and_checked(tmp_path: Path, ref: str, message: str) -> None:
    inner = tmp_path / "inner"
    inner.mkdir()
    (tmp_path / "outside.npy").write_bytes(b"")
    (inner / "notes.txt").write_text("1", encoding="utf-8")
    np.save(inner / "obj.npy", np.array([object()], dtype=object), allow_pickle=True)
    (inner / "link.npy").symlink_to(tmp_path / "outside.npy")
    f = inner / "e.toml"
    f.write_text(f"[[example]]\nname = 'E'\nscores = {json.dumps(ref)}\n", encoding="utf-8")
    with pytest.raises(ExampleFileError) as info:
        load_examples(f)
    assert message in str(info.value) and str(f) in str(info.value)


def test_file_inputs_need_a_folder() -> None:
    with pytest.raises(ExampleFileError, match="not read from a file"):
        load_examples(text="[[example]]\nname = 'E'\nscores = 'x.npy'\n")


def test_oversized_array_file_is_refused_before_reading(tmp_path: Path, monkeypatch: Any) -> None:
    from mha_symbolic.textbook import arrays

    monkeypatch.setattr(arrays, "MAX_ARRAY_BYTES", 100)
    np.save(tmp_path / "big.npy", np.zeros(100))
    f = tmp_path / "e.toml"
    f.write_text("[[example]]\nname = 'E'\nscores = 'big.npy'\n", encoding="utf-8")
    with pytest.raises(ExampleFileError, match="more than 100"):
        load_examples(f)


def test_seeded_init_cache_must_match_its_recipe(tmp_path: Path) -> None:
    from mha_symbolic.textbook.seeded import recipe_text

    init = {"torch_seed": 1, "draws": ["w_q = rand(2, 2)"], "cache": "c.npz"}
    np.savez(tmp_path / "c.npz", __recipe__=np.array(recipe_text({**init, "torch_seed": 2})),
             w_q=np.eye(2, dtype=np.float32))
    f = tmp_path / "e.toml"
    f.write_text("[[example]]\nname = 'E'\nx = [[1, 0]]\nw_k = [[1, 0], [0, 1]]\n"
                 "w_v = [[1, 0], [0, 1]]\n[example.init]\ntorch_seed = 1\n"
                 "draws = ['w_q = rand(2, 2)']\ncache = 'c.npz'\n", encoding="utf-8")
    with pytest.raises(ExampleFileError, match="another recipe"):
        load_examples(f)


@pytest.mark.parametrize(("draw", "message"), [
    ("w_q = eval(1)", "is not"), ("w_z = rand(2, 2)", "unknown target"),
    ("x = Linear(3, 2)", "draws a weight"), ("w_q = rand(0, 2)", "positive"),
    ("w_q[0] = rand(2, 2)", "1-based"), ("w_q = rand(2, 2, bias=False)", "belongs to Linear"),
])
def test_bad_draws_are_refused(draw: str, message: str) -> None:
    from mha_symbolic.textbook.seeded import parse_draw

    with pytest.raises(ExampleFileError, match=message):
        parse_draw(draw)


def test_seeded_caches_are_what_torch_draws() -> None:
    """Every .npz cache of the corpus equals a replay of its recipe with torch, bit for bit."""
    torch = pytest.importorskip("torch")
    import sys

    from mha_symbolic.textbook.seeded import _cache_names, draw, recipe_text

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    books = Path(__file__).resolve().parents[2] / "examples" / "books"
    seen = 0
    for path in sorted(books.glob("*.toml")):
        for ex in tomllib.loads(path.read_text(encoding="utf-8"))["example"]:
            init = ex.get("init")
            if not init or "torch_seed" not in init:  # numpy's draws need no cache
                continue
            cache = np.load(books / init["cache"], allow_pickle=False)
            assert str(cache["__recipe__"]) == recipe_text(init)
            values = draw(init)
            names = _cache_names(values)
            for key, arr in values.items():
                assert np.array_equal(cache[names[key]], arr), (path.name, key)
            seen += 1
    assert seen >= 8 and torch.__version__


def test_seeded_draws_reproduce_the_raschka_query() -> None:
    """torch.manual_seed(123); three torch.rand(3, 2): x_2 W_query = (0.4306, 1.4551) as the
    book prints — checked here from the cache with Fractions."""
    books = Path(__file__).resolve().parents[2] / "examples" / "books"
    cache = np.load(books / "raschka-llm-from-scratch-seed123-rand.npz")
    w = [[F(*float(v).as_integer_ratio()) for v in row] for row in cache["w_q"]]
    x2 = [F("0.55"), F("0.87"), F("0.66")]
    q = [sum((x2[i] * w[i][j] for i in range(3)), F(0)) for j in range(2)]
    assert [round(float(v), 4) for v in q] == [0.4306, 1.4551]


def test_a_pasted_printout_is_an_input() -> None:
    pasted = base(scale=1) + 'scores = """tensor([[0.5100, 0.0000],\n        [1.0000, 2.0000]])"""\n'
    plain = base(scale=1, scores=[["0.5100", "0"], [1, 2]])
    a, b = load_examples(text=pasted)[0], load_examples(text=plain)[0]
    assert a.attention().heads[0].weights == b.attention().heads[0].weights
    masked = base(scale=1, scores=[[0, 0]]) + 'mask = "tensor([[True, False]])"\n'
    assert one(masked + claim("weight[1]", "(1, 0)")).verdict == "exact"
