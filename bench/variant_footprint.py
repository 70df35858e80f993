"""Where each registered variant lives, counted from the source (issue 23's measure:
"each new variant must touch at most 4 files of the package — its module, its
registration, docs, and at most one more").

    python bench/variant_footprint.py            # a table, one line per variant
                                                 # (files: in the package; wings: in
                                                 # oracle/ and testing/)
    python bench/variant_footprint.py --files    # and the files with what names them

A package file *names* a variant when its code (not its docstrings or comments)
refers to something only that variant defines:

* an import from the variant's module (``from .rotary import ...``, or the module
  itself);
* one of the variant's door keywords or option fields, as an attribute
  (``opts.rotary``), a parameter or keyword argument (``softcap=``), a variable, or a
  string constant (``"alibi_slopes"``).

The variant's own module, the registry (its one import line) and, for a variant
that adds public functions (the KV cache's ``gather_kv_cache`` and its door), the
package's one export table (``mha_symbolic/__init__.py``: one line per public name;
``mha_symbolic.testing`` derives its names from it) are its registration; every
other file counted is code that has to know the variant.  The issue's limit: "its
module, its registration, docs, and at most one more" — at most one file in the
``beyond`` column.  What a
variant does through the protocol's hooks (keep, scores, sinks, inputs, rotate,
error, bugs, sequence) names it nowhere else, so a variant built only on hooks counts
2.  The count is a lower bound on what a real change touches (docs, tests and
benches are apart), and an upper bound on what a *new* variant of an existing kind
must touch: the hooks it needs are already there.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "mha_symbolic"
VARIANTS = PKG / "oracle" / "variants"
#: generic words a variant also uses as a field name: counted only as an attribute of
#: an options object or a string constant, not as a bare name
GENERIC = {"window"}


def _docstring_nodes(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                skip.add(id(body[0].value))
    return skip


def names_in(path: Path, module: str, words: set[str]) -> set[str]:
    """What in ``path``'s code names the variant of ``module`` with ``words``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstring_nodes(tree)
    hits: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if mod.split(".")[-1] == module or any(a.name == module for a in node.names):
                hits.add(f"import {mod or '.'}:{','.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Attribute) and node.attr in words:
            hits.add(f".{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docs and node.value in words:
            hits.add(repr(node.value))
        elif isinstance(node, ast.keyword) and node.arg in words - GENERIC:
            hits.add(f"{node.arg}=")
        elif isinstance(node, ast.arg) and node.arg in words - GENERIC:
            hits.add(f"param {node.arg}")
        elif isinstance(node, ast.Name) and node.id in words - GENERIC:
            hits.add(node.id)
    return hits


def footprint() -> list[tuple[str, str, dict[str, set[str]]]]:
    sys.path.insert(0, str(ROOT))
    from mha_symbolic.oracle.variants import protocol, registry  # noqa: F401  (registration)

    files = sorted(p for p in PKG.rglob("*.py"))
    rows = []
    for v in protocol.registered():
        fn = getattr(v.parse, "__module__", "") or ""
        module = fn.rsplit(".", 1)[-1]
        words = set(v.keywords) | set(v.fields)
        where: dict[str, set[str]] = defaultdict(set)
        for f in files:
            rel = str(f.relative_to(ROOT))
            if f == VARIANTS / f"{module}.py":
                where[rel].add("its module")
                continue
            hits = names_in(f, module, words)
            if hits:
                where[rel] |= hits
        rows.append((v.name, module, dict(where)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", action="store_true", help="list the files and what names them")
    args = ap.parse_args()
    rows = footprint()
    print(f"{'variant':<18} {'module':<12} {'files':>5} {'wings':>5} {'beyond':>6}  files beyond "
          "its registration (its module, the registry, the export table)")
    own = {"mha_symbolic/oracle/variants/registry.py", "mha_symbolic/__init__.py"}
    for name, module, where in rows:
        others = [f for f in where if f not in own | {f"mha_symbolic/oracle/variants/{module}.py"}]
        wings = [f for f in where if f.startswith(("mha_symbolic/oracle/", "mha_symbolic/testing/"))]
        print(f"{name:<18} {module:<12} {len(where):>5} {len(wings):>5} {len(others):>6}  "
              f"{', '.join(others) or '-'}")
        if args.files:
            for f, hits in sorted(where.items()):
                print(f"    {f}: {', '.join(sorted(hits))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
