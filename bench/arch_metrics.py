"""The shape of the house, counted from the source (issue 23): import circles and
arrows that run back up a level in each wing, in-function imports of the package,
modules over 800 lines, functions over 80 lines.

    python bench/arch_metrics.py                 # oracle and testing wings
    python bench/arch_metrics.py exact textbook  # other wings

An arrow A → B is an import of module B by module A inside the package (relative or
absolute, at module level or inside a function; `if TYPE_CHECKING:` blocks are not
counted).  Levels: a module's level is 0 if it imports nothing of the wing, else one
more than the highest level of what it imports over the graph with its circles
collapsed; an arrow "runs back up" when it goes from a lower level to a higher one,
which only an in-function import can do.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "mha_symbolic"
MAX_LINES, MAX_FUNC = 800, 80

#: optional dependencies: a module importing one at module level is imported lazily
#: (inside a function) by design, so that nothing heavy loads on import
OPTIONAL = {"numba", "torch", "jax", "matplotlib", "tqdm", "hypothesis"}
#: modules that import the package lazily by design, with the reason
LAZY_MODULES = {
    "mha_symbolic.testing.pytest_plugin":
        "loaded by pytest in every project that installs mha-symbolic: imports only "
        "pytest and the standard library until a fixture is used",
}
#: the folder order inside each wing: an arrow may only point to the same or a lower
#: rank (lower = imported by the others)
RANKS = {
    "oracle": [("arith",), ("conventions", "inputs", "mp", "progress", "enclosure"),
               ("forward",), ("backward",), ("variants",), ("api",)],
    "testing": [("options", "tolerance", "call"), ("forward",), ("backward",),
                ("verdict", "report"),
                ("forward.compare", "forward.variants", "forward.mha", "forward.kvcache",
                 "backward.compare", "backward.mha", "backward.softmax_d", "backward.rotated"),
                ("check", "source_items", "strategies"), ("pytest_plugin",)],
}


def _modname(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> list[str]:
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    if node.level:
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    names = [target]
    if node.module is None or node.level:
        names += [f"{target}.{a.name}" for a in node.names]
    return names


def _type_checking(node: ast.AST) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
            and node.test.id == "TYPE_CHECKING")


def _optional_at_top(tree: ast.Module) -> bool:
    for node in tree.body:
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                 else [])
        if any(n.split(".")[0] in OPTIONAL for n in names):
            return True
    return False


OPTIONAL_MODULES: set[str] = set()


def scan() -> tuple[dict[str, set[str]], dict[str, set[str]], dict[str, int], list[tuple[str, str, int]]]:
    files = {_modname(p): p for p in ROOT.rglob("*.py")}
    arrows: dict[str, set[str]] = defaultdict(set)
    inner: dict[str, set[str]] = defaultdict(set)
    lines: dict[str, int] = {}
    long_funcs: list[tuple[str, str, int, int]] = []
    for mod, path in files.items():
        src = path.read_text()
        lines[mod] = src.count("\n") + 1
        tree = ast.parse(src)
        is_pkg = path.name == "__init__.py"
        if _optional_at_top(tree):
            OPTIONAL_MODULES.add(mod)

        def visit(node: ast.AST, in_func: bool, mod: str = mod, is_pkg: bool = is_pkg) -> None:
            for child in ast.iter_child_nodes(node):
                if _type_checking(child):
                    continue
                f = in_func or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = (child.end_lineno or child.lineno) - child.lineno + 1
                    if n > MAX_FUNC:
                        long_funcs.append((mod, child.name, n, n - _doc_lines(child)))
                targets: list[str] = []
                if isinstance(child, ast.ImportFrom):
                    targets = _resolve(mod, is_pkg, child)
                elif isinstance(child, ast.Import):
                    targets = [a.name for a in child.names]
                if isinstance(child, ast.ImportFrom) and any(
                        x in files for x in targets[1:]):
                    targets = [x for x in targets[1:] if x in files]  # submodules by name
                for t in targets:
                    if t in files and t != mod:
                        arrows[mod].add(t)
                        if in_func:
                            inner[mod].add(t)
                visit(child, f, mod, is_pkg)

        visit(tree, False)
    return arrows, inner, lines, long_funcs


def _doc_lines(func: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The lines of ``func``'s docstring (0 without one)."""
    first = func.body[0] if func.body else None
    if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        return (first.end_lineno or first.lineno) - first.lineno + 1
    return 0


def _sccs(nodes: list[str], edges: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            strong(v)
    return out


def wing_report(wing: str, arrows: dict[str, set[str]], inner: dict[str, set[str]],
                lines: dict[str, int], long_funcs: list[tuple[str, str, int, int]]) -> None:
    pre = f"mha_symbolic.{wing}"
    mods = sorted(m for m in lines if m == pre or m.startswith(pre + "."))
    edges = {m: {t for t in arrows.get(m, ()) if t in mods and t != pre} for m in mods
             if m != pre}
    nodes = sorted(edges)
    comps = _sccs(nodes, edges)
    comp_of = {v: i for i, c in enumerate(comps) for v in c}
    circles = [c for c in comps if len(c) > 1]
    # levels over the condensation, module-level arrows only
    top = {m: {t for t in edges[m] if t not in inner.get(m, set())} for m in nodes}
    level: dict[str, int] = {}

    def lev(m: str, seen: frozenset[str] = frozenset()) -> int:
        if m in level:
            return level[m]
        if m in seen:
            return 0
        deps = [t for t in top[m] if comp_of[t] != comp_of[m]]
        level[m] = 1 + max((lev(t, seen | {m}) for t in deps), default=-1)
        return level[m]

    for m in nodes:
        lev(m)
    n_arrows = sum(len(e) for e in edges.values())

    def lazy(m: str, t: str) -> bool:
        return t in inner.get(m, set()) and (m in LAZY_MODULES or t in OPTIONAL_MODULES)

    back_up = [(m, t) for m in nodes for t in edges[m] if level[t] >= level[m]
               and comp_of[t] != comp_of[m] and not lazy(m, t)]
    lazies = [(m, t) for m in nodes for t in edges[m] if lazy(m, t)]
    inner_pkg = sum(1 for m in nodes for t in inner.get(m, set())
                    if t in mods and not lazy(m, t))
    ranks = {name: r for r, group in enumerate(RANKS.get(wing, [])) for name in group}

    def rank(m: str) -> int | None:
        rel = m.removeprefix(pre + ".")
        return ranks.get(rel, ranks.get(rel.split(".")[0]))

    against = [(m, t) for m in nodes for t in edges[m]
               if rank(m) is not None and rank(t) is not None and rank(t) > rank(m)  # type: ignore[operator]
               and not lazy(m, t)]
    big = [(m, n) for m, n in lines.items() if m in nodes and n > MAX_LINES]
    longf = [(m, f, n, c) for m, f, n, c in long_funcs if m in nodes]
    n_code = sum(c > MAX_FUNC for *_, c in longf)
    print(f"{wing}/: {len(nodes)} modules on {1 + max(level.values(), default=-1)} levels, "
          f"{n_arrows} import arrows, {len(back_up)} running back up, "
          f"{len(circles)} circles, {len(against)} against the folder order, "
          f"{inner_pkg} in-function imports of the package ({len(lazies)} more lazy by "
          "design), "
          f"{len(big)} modules over {MAX_LINES} lines, {len(longf)} functions over "
          f"{MAX_FUNC} lines ({n_code} over {MAX_FUNC} lines of code, the docstring "
          "excluded)")
    for c in circles:
        print("  circle:", " ↔ ".join(sorted(x.removeprefix(pre + ".") for x in c)))
    for m, t in back_up:
        print(f"  back up: {m.removeprefix(pre + '.')} → {t.removeprefix(pre + '.')}")
    for m, t in against:
        print(f"  against the folder order: {m.removeprefix(pre + '.')} → "
              f"{t.removeprefix(pre + '.')}")
    for m in sorted({m for m, _ in lazies}):
        why = LAZY_MODULES.get(m, "imports an optional dependency (" + ", ".join(
            sorted(t.removeprefix(pre + ".") for mm, t in lazies if mm == m)) + ")")
        print(f"  lazy by design: {m.removeprefix(pre + '.')}: {why}")
    for m in nodes:
        for t in sorted(inner.get(m, set())):
            if t in mods and not lazy(m, t):
                print(f"  in-function import: {m.removeprefix(pre + '.')} → "
                      f"{t.removeprefix(pre + '.')}")
    for m, n in big:
        print(f"  {n} lines: {m}")
    for m, f, n, c in sorted(longf, key=lambda x: -x[3]):
        print(f"  {n}-line function ({c} of code): {m}.{f}")


def main() -> None:
    wings = sys.argv[1:] or ["oracle", "testing"]
    arrows, inner, lines, long_funcs = scan()
    for w in wings:
        wing_report(w, arrows, inner, lines, long_funcs)
    pkg = sorted(m for m in lines if m != "mha_symbolic")
    edges = {m: {t for t in arrows.get(m, ()) if t in pkg} for m in pkg}
    circles = [c for c in _sccs(pkg, edges) if len(c) > 1]
    print(f"package: {len(circles)} import circles "
          f"({sum(len(c) for c in circles)} modules in them)")


if __name__ == "__main__":
    main()
