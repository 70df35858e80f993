"""Inputs drawn by a seeded initialiser, exactly as the book's code drew them.

Many worked examples never print their weights: the code calls
``torch.manual_seed(123)`` and builds ``nn.Linear`` layers (or ``torch.rand``).  A
worked example states the recipe, and the draws are replayed::

    [example.init]
    torch_seed = 123
    draws = ["w_q = Linear(3, 2, bias=False)", "w_k = Linear(3, 2, bias=False)",
             "w_v = Linear(3, 2, bias=False)", "w_o = Linear(2, 2)"]
    cache = "raschka-mha-init.npz"      # optional: the draws, for machines without torch

With ``numpy_seed = s`` (``np.random.seed(s)``, numpy's legacy generator) or
``numpy_default_rng = s`` (``rng = np.random.default_rng(s)``) in place of
``torch_seed``, ``rand(…)`` and ``randn(…)`` replay ``np.random.rand``/``randn`` or
``rng.random``/``rng.standard_normal`` with numpy itself (no cache needed).

``seed(N)`` between draws replays a second ``torch.manual_seed(N)``;
``x = Embedding(vocab, d)[i, j, …]`` draws an ``nn.Embedding(vocab, d)`` and looks up
the rows of the token indices i, j, … (as ``embed(torch.tensor([i, j, …]))``).

Each draw is ``TARGET = rand(d, …)``, ``randn(d, …)`` or ``Linear(in, out[, bias=False])``,
in the order the book's code makes them (the generator's state runs through them);
``TARGET`` is an input key, or ``w_q[2]`` for head 2 of a per-head list.  A ``Linear``
gives its weight (out, in) transposed to the engine's (in, out) layout, and its bias
(unless ``bias=False``) as the matching ``b_*`` key.  The values are float32 numbers
taken *exactly* (their binary values).

Replaying needs torch (it is torch's generator); it is imported only for this.
With a ``cache`` the values are read from the ``.npz`` file beside the worked example
instead (no torch needed); the cache records its recipe, and a recipe that no longer
matches it is an error.  ``python -m mha_symbolic.textbook.seeded FILE.toml`` writes
every cache of a file (needs torch); the test suite replays each cache's recipe when
torch is installed and compares bit for bit.

>>> parse_draw("w_q[2] = Linear(3, 2, bias=False)")
('w_q', 2, 'Linear', (3, 2), False)
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from typing import Any

from .._text import echo, expr_text
from ..errors import ExampleFileError
from .integer_draws import parse_integer_draw, replay_integer_draw

__all__ = ["INIT_KEYS", "draw", "draw_entries", "parse_draw", "recipe_text", "resolve_init", "write_cache"]

INIT_KEYS = frozenset({"torch_seed", "numpy_seed", "numpy_default_rng", "draws", "cache"})
#: The generators a recipe may name, one per recipe: torch's, numpy's legacy
#: ``np.random.seed`` (a ``RandomState``), numpy's ``np.random.default_rng(seed)``.
_SEEDS = ("torch_seed", "numpy_seed", "numpy_default_rng")
_DRAW = re.compile(
    r"^\s*(?P<target>[a-z_]+)(?:\[(?P<index>[0-9]{1,3})\])?\s*=\s*(?P<fn>rand|randn|Linear)\s*\("
    r"(?P<args>[0-9\s,]*?)(?:,\s*bias\s*=\s*(?P<bias>True|False))?\s*\)\s*$")
#: Most draws in one recipe, and most entries in one draw.
MAX_DRAWS = 64
MAX_DRAW_ENTRIES = 65_536
_TARGETS = ("x", "x_kv", "query", "key", "value", "scores", "w_q", "w_k", "w_v", "w_o", "w_qkv")


_INTEGERS = re.compile(r"^\s*(?P<target>[a-z_]+)(?:\[(?P<index>[0-9]{1,3})\])?\s*=\s*"
                       r"(?P<call>(?:[A-Za-z_]\w{0,31}\s*\.\s*){0,3}(?:randint|integers)\s*"
                       r"\(.*\))\s*$")
_RESEED = re.compile(r"^\s*seed\s*\(\s*(?P<seed>[0-9]{1,19})\s*\)\s*$")
_EMBED = re.compile(r"^\s*(?P<target>[a-z_]+)\s*=\s*Embedding\s*\(\s*(?P<vocab>[0-9]{1,6})\s*,"
                    r"\s*(?P<dim>[0-9]{1,6})\s*\)\s*\[(?P<rows>[0-9\s,]*)\]\s*$")


def parse_draw(text: str) -> tuple[str, int, str, tuple[int, ...], bool]:
    """(target, head index or 0, function, sizes, bias) of one draw.  ``seed(N)`` (the
    code calls ``torch.manual_seed(N)`` again) has target "" and sizes (N,);
    ``x = Embedding(vocab, d)[i, j, …]`` (an ``nn.Embedding`` drawn, then rows looked up)
    has sizes (vocab, d, i, j, …)."""
    if isinstance(text, str) and len(text) <= 200 and (r := _RESEED.match(text)):
        return "", 0, "seed", (int(r.group("seed")),), False
    if isinstance(text, str) and len(text) <= 200 and (e := _EMBED.match(text)):
        vocab, dim = int(e.group("vocab")), int(e.group("dim"))
        rows = tuple(int(i) for i in e.group("rows").replace(" ", "").split(",") if i)
        if e.group("target") not in ("x", "x_kv", "query", "key", "value"):
            raise ExampleFileError(f"draw {text!r}: an Embedding gives x, x_kv, query, key or value")
        if not rows or vocab < 1 or dim < 1 or any(i >= vocab for i in rows) \
                or vocab * dim > MAX_DRAW_ENTRIES or len(rows) * dim > MAX_DRAW_ENTRIES:
            raise ExampleFileError(f"draw {text!r}: Embedding(vocab, d)[rows] needs rows below "
                                   f"vocab and at most {MAX_DRAW_ENTRIES} entries")
        return e.group("target"), 0, "Embedding", (vocab, dim, *rows), False
    if isinstance(text, str) and len(text) <= 200 and (n := _INTEGERS.match(text)):
        target = n.group("target")
        if target not in _TARGETS:
            raise ExampleFileError(f"draw {text!r}: unknown target {target!r}; one of "
                                   f"{', '.join(_TARGETS)}")
        index = int(n.group("index") or 0)
        if n.group("index") is not None and index < 1:
            raise ExampleFileError(f"draw {text!r}: head indices are 1-based")
        d = parse_integer_draw(n.group("call"))
        return target, index, d.fn, d.size, False
    m = _DRAW.match(text) if isinstance(text, str) and len(text) <= 200 else None
    if m is None:
        raise ExampleFileError(f"draw {str(text)[:60]!r} is not 'TARGET = rand(…)', 'randn(…)', "
                               "'randint(…)', 'integers(…)' or 'Linear(in, out[, bias=False])'")
    target = m.group("target")
    if target not in _TARGETS:
        raise ExampleFileError(f"draw {text!r}: unknown target {target!r}; one of {', '.join(_TARGETS)}")
    sizes = tuple(int(a) for a in m.group("args").replace(" ", "").split(",") if a)
    fn = m.group("fn")
    if not sizes or any(s < 1 for s in sizes) or len(sizes) > 4:
        raise ExampleFileError(f"draw {text!r}: sizes must be 1 to 4 positive integers")
    total = 1
    for s in sizes:
        total *= s
    if total > MAX_DRAW_ENTRIES:
        raise ExampleFileError(f"draw {text!r}: more than {MAX_DRAW_ENTRIES} entries")
    if fn == "Linear":
        if len(sizes) != 2 or not target.startswith("w_"):
            raise ExampleFileError(f"draw {text!r}: Linear(in, out) draws a weight (w_q, w_k, …)")
    elif m.group("bias") is not None:
        raise ExampleFileError(f"draw {text!r}: bias= belongs to Linear")
    bias = m.group("bias") != "False" if fn == "Linear" else False
    index = int(m.group("index") or 0)
    if m.group("index") is not None and index < 1:
        raise ExampleFileError(f"draw {text!r}: head indices are 1-based")
    return target, index, fn, sizes, bias


def _draw_function(text: str) -> str | None:
    """The function a draw calls (``Linear``, ``randint``, ``seed`` …), read by its name
    only (None when none is recognised; the draw is then refused by :func:`parse_draw`)."""
    if _RESEED.match(text):
        return "seed"
    m = re.match(r"^[^=]*=\s*(?:[A-Za-z_]\w{0,31}\s*\.\s*){0,3}([A-Za-z_]+)\s*[(]", text)
    return m.group(1) if m else None


def draw_entries(text: str) -> int:
    """How many numbers a draw makes (counted before anything is drawn): its size; an
    Embedding's whole table (vocab × d); a ``seed(N)`` none."""
    _, _, fn, sizes, _ = parse_draw(text)
    if fn == "seed":
        return 0
    if fn == "Embedding":
        return sizes[0] * sizes[1]
    return math.prod(sizes)


def recipe_text(init: dict[str, Any]) -> str:
    """A canonical one-line form of a recipe (what a cache records)."""
    kind = next((k for k in _SEEDS if k in init), "torch_seed")
    return f"{kind}={init[kind]}; " + "; ".join(init["draws"])


def _check(init: Any, where: str) -> dict[str, Any]:
    if not isinstance(init, dict):
        raise ExampleFileError(f"{where}: init must be a table ([example.init])")
    unknown = set(init) - INIT_KEYS
    if unknown:
        raise ExampleFileError(f"{where}: init: unknown key(s) {echo(', '.join(sorted(unknown)))}; "
                               f"known: {', '.join(sorted(INIT_KEYS))}")
    kinds = [k for k in _SEEDS if k in init]
    if len(kinds) != 1:
        raise ExampleFileError(f"{where}: init needs exactly one of {', '.join(_SEEDS)}")
    kind = kinds[0]
    seed = init.get(kind)
    top = 2**63 if kind == "torch_seed" else 2**32
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < top:
        raise ExampleFileError(f"{where}: init.{kind}={expr_text(seed)} must be a "
                               f"non-negative integer below 2^{63 if top == 2**63 else 32}")
    own = {"torch_seed": "rand(…), randn(…), Linear, Embedding or seed(…)",
           "numpy_seed": "rand(…), randn(…) or randint(…)",
           "numpy_default_rng": "rand(…), randn(…) or integers(…)"}[kind]
    for d in draws if isinstance(draws := init.get("draws"), list) else []:
        if not isinstance(d, str):
            continue
        fn = _draw_function(d)
        allowed = {"torch_seed": ("rand", "randn", "Linear", "Embedding", "seed"),
                   "numpy_seed": ("rand", "randn", "randint"),
                   "numpy_default_rng": ("rand", "randn", "integers")}[kind]
        if fn is not None and fn not in allowed:
            raise ExampleFileError(f"{where}: init: {echo(d, 60)} is not a draw of {kind}'s "
                                   f"generator; with {kind} draw {own}")
    draws = init.get("draws")
    if not isinstance(draws, list) or not draws or len(draws) > MAX_DRAWS:
        raise ExampleFileError(f"{where}: init.draws must be a list of 1 to {MAX_DRAWS} draws")
    for d in draws:
        try:
            parse_draw(d)
        except ExampleFileError as exc:
            raise ExampleFileError(f"{where}: init: {exc}") from None
    cache = init.get("cache")
    if cache is not None and not isinstance(cache, str):
        raise ExampleFileError(f"{where}: init.cache must be a file name")
    return init


def _draw_numpy(init: dict[str, Any]) -> dict[str, Any]:
    """Replay numpy draws: ``np.random.seed(s)`` then ``np.random.rand``/``randn`` (the
    legacy ``RandomState``), or ``rng = np.random.default_rng(s)`` then ``rng.random`` /
    ``rng.standard_normal``; float64 values, taken exactly."""
    import numpy as np

    out: dict[str, Any] = {}
    legacy = "numpy_seed" in init
    gen: Any = (np.random.RandomState(int(init["numpy_seed"])) if legacy
                else np.random.default_rng(int(init["numpy_default_rng"])))
    for text in init["draws"]:
        target, index, fn, sizes, _ = parse_draw(text)
        name = f"{target}[{index}]" if index else target
        if fn in ("randint", "integers"):
            out[name] = replay_integer_draw(gen, parse_integer_draw(text.split("=", 1)[1]), text)
        elif legacy:
            out[name] = gen.rand(*sizes) if fn == "rand" else gen.randn(*sizes)
        else:
            out[name] = gen.random(sizes) if fn == "rand" else gen.standard_normal(sizes)
    return out


def draw(init: dict[str, Any]) -> dict[str, Any]:
    """Replay the draws with torch: {key: float32 numpy array} (per-head targets as
    ``w_q[2]``).  Needs torch (numpy's generators: numpy only)."""
    if "torch_seed" not in init:
        return _draw_numpy(init)
    try:
        import torch
    except ImportError:
        raise ExampleFileError("init: replaying torch_seed draws needs torch (pip install torch); "
                               "or give init.cache, the draws saved in an .npz file") from None
    out: dict[str, Any] = {}
    torch.manual_seed(int(init["torch_seed"]))
    with torch.no_grad():
        for text in init["draws"]:
            target, index, fn, sizes, bias = parse_draw(text)
            name = f"{target}[{index}]" if index else target
            if fn == "seed":
                torch.manual_seed(sizes[0])
            elif fn == "Embedding":
                table = torch.nn.Embedding(sizes[0], sizes[1]).weight.detach().numpy()
                out[name] = table[list(sizes[2:])].copy()
            elif fn == "rand":
                out[name] = torch.rand(*sizes).numpy()
            elif fn == "randn":
                out[name] = torch.randn(*sizes).numpy()
            else:
                layer = torch.nn.Linear(sizes[0], sizes[1], bias=bias)
                out[name] = layer.weight.detach().numpy().T.copy()
                if bias:
                    b = "b_" + target[2:]
                    out[f"{b}[{index}]" if index else b] = layer.bias.detach().numpy().copy()
    return out


def _cache_names(values: dict[str, Any]) -> dict[str, str]:  # 'w_q[2]' → 'w_q__2'
    return {k: k.replace("[", "__").replace("]", "") for k in values}


def write_cache(init: dict[str, Any], path: Path) -> dict[str, Any]:
    """Replay the draws (torch) and save them, with the recipe, to ``path`` (.npz)."""
    import numpy as np

    values = draw(init)
    names = _cache_names(values)
    np.savez(path, __recipe__=np.array(recipe_text(init)),
             **{names[k]: v for k, v in values.items()})
    return values


def _read_cache(init: dict[str, Any], base: Path | None, where: str) -> dict[str, Any]:
    from .arrays import load_array

    data = load_array(init["cache"], base, f"{where}: init.cache")
    if not isinstance(data, dict) or "__recipe__" not in data:
        raise ExampleFileError(f"{where}: init.cache {echo(init['cache'])} records no recipe")
    recorded = str(data.pop("__recipe__"))
    if recorded != recipe_text(init):
        raise ExampleFileError(f"{where}: init.cache {echo(init['cache'])} was drawn for another "
                               f"recipe ({echo(recorded)}); rewrite it with "
                               "python -m mha_symbolic.textbook.seeded FILE")
    back = {v: k for k, v in _cache_names(dict.fromkeys(_expected(init))).items()}
    out: dict[str, Any] = {}
    for k, v in data.items():
        out[back.get(str(k), str(k))] = v
    return out


def _expected(init: dict[str, Any]) -> list[str]:
    names = []
    for text in init["draws"]:
        target, index, fn, _, bias = parse_draw(text)
        if fn == "seed":
            continue
        names.append(f"{target}[{index}]" if index else target)
        if fn == "Linear" and bias:
            b = "b_" + target[2:]
            names.append(f"{b}[{index}]" if index else b)
    return names


def _check_targets(init: dict[str, Any], given: frozenset[str], where: str) -> None:
    """What the draws will hold, checked before anything is drawn (a draw of 65,536
    entries costs about a second): no target drawn twice, and the projections' inputs
    complete (x needs w_q, w_k and w_v, drawn or given)."""
    names = _expected(init)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ExampleFileError(f"{where}: init draws {echo(twice[0])} twice")
    have = given | {n.split("[", 1)[0] for n in names}
    if "x" in have and "w_qkv" not in have and not {"w_q", "w_k", "w_v"} <= have:
        raise ExampleFileError(f"{where}: init: x needs w_q, w_k and w_v (drawn or given)")


def resolve_init(init: Any, base: Path | None, where: str,
                 given: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The inputs a recipe draws, as exact nested lists; per-head targets gathered into
    lists (``w_q[1]``, ``w_q[2]`` → ``w_q = [W₁, W₂]``).  ``given``: the example's other
    input keys (checked with the draws before anything is drawn)."""
    from .arrays import exact_entries

    init = _check(init, where)
    _check_targets(init, given, where)
    values = (_read_cache(init, base, where) if init.get("cache") and base is not None
              and (base / init["cache"]).exists() else draw(init))
    plain: dict[str, Any] = {}
    heads: dict[str, dict[int, Any]] = {}
    for name, arr in values.items():
        exact = exact_entries(arr, where=f"{where}: init {name}")
        if "[" in name:
            key, idx = name[:-1].split("[")
            heads.setdefault(key, {})[int(idx)] = exact
        else:
            plain[name] = exact
    for key, per in heads.items():
        if sorted(per) != list(range(1, len(per) + 1)):
            raise ExampleFileError(f"{where}: init draws {key}[…] for heads {sorted(per)}; "
                                   "expected 1, 2, … without gaps")
        if key in plain:
            raise ExampleFileError(f"{where}: init draws both {key} and {key}[…]")
        plain[key] = [per[i] for i in sorted(per)]
    return plain


def _main(argv: list[str]) -> int:  # pragma: no cover - a maintainer's tool, needs torch
    import tomllib

    if len(argv) != 1:
        print("usage: python -m mha_symbolic.textbook.seeded FILE.toml", file=sys.stderr)
        return 2
    path = Path(argv[0])
    doc = tomllib.loads(path.read_text(encoding="utf-8"))
    for ex in doc.get("example", []):
        init = ex.get("init")
        if init and init.get("cache"):
            target = path.parent / init["cache"]
            write_cache(_check(init, str(path)), target)
            print(f"wrote {target}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_main(sys.argv[1:]))
