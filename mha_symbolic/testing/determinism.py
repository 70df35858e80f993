"""Bitwise checks of a kernel against itself: :func:`check_deterministic` (the same
call twice gives the same bits, forward and backward) and
:func:`check_batch_invariance` (a batch element gives the same bits whatever else is
in the batch).

FlashAttention's deterministic backward is tested with ``torch.equal`` across runs;
batch-invariant kernels (reproducible LLM inference) promise that a request's output
does not depend on its batch-mates.  Both are questions about bits, not tolerances:
values are compared as their bit patterns (so -0.0 differs from 0.0 and a NaN equals
the same NaN), and nothing is compared with the exact answer — use
:func:`~mha_symbolic.check_attention` for that.

Gradients come from the kernel's own autograd, as in :func:`~.check.check_attention`:
``torch.autograd.grad`` (torch tensors) or ``jax.vjp`` (jax arrays), against a fixed
``grad_output``; numpy kernels are checked forward only.

>>> import numpy as np
>>> x = np.arange(24.0).reshape(2, 1, 3, 4)
>>> check_deterministic(lambda q, k, v: q + 0.0, x, x, x).passed
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._display import ReportDisplay
from ..errors import AttentionMismatchError, SpecError

__all__ = ["BitwiseCheck", "check_batch_invariance", "check_deterministic"]


@dataclass(frozen=True, repr=False)
class BitwiseCheck(ReportDisplay):
    """What a bitwise check found: ``passed``, the ``title`` of the check, and per
    compared tensor (``"output"``, ``"dq"``, ``"dk"``, ``"dv"``, with the run or batch
    element it concerns) the number of elements whose bits differ and the first."""

    passed: bool
    title: str
    framework: str
    findings: tuple[tuple[str, int, int, tuple[int, ...] | None], ...]  # (what, n_diff, n, first)

    def __bool__(self) -> bool:
        return self.passed

    def summary(self) -> str:
        bad = [f for f in self.findings if f[1]]
        if not bad:
            return (f"{self.title}: passed ({self.framework}; {len(self.findings)} "
                    "tensor(s) bitwise equal)")
        what, n, tot, first = bad[0]
        more = f" (and {len(bad) - 1} more tensor(s))" if len(bad) > 1 else ""
        return (f"{self.title}: FAILED ({self.framework}): {what} differs in {n} / {tot} "
                f"element(s), first at {first}{more}")

    def report(self) -> str:
        lines = [self.summary()]
        for what, n, tot, first in self.findings:
            lines.append(f"  {what}: " + ("bitwise equal" if not n else
                                          f"{n} / {tot} element(s) differ, first at {first}"))
        return "\n".join(lines)

    def table(self) -> tuple[tuple[str, ...], list[tuple[str, str]]]:
        return ("compared", "finding"), [
            (w, "bitwise equal" if not n else f"{n} / {t} differ, first at {f}")
            for w, n, t, f in self.findings]


def _framework(x: Any) -> str:
    mod = type(x).__module__ or ""
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith(("jax", "jaxlib")):
        return "jax"
    return "numpy"


def bits(x: Any) -> np.ndarray:
    """The bit patterns of a float array (numpy, torch — any device —, jax) as a numpy
    unsigned integer array of its shape: a copy (a snapshot, never a view of ``x``)."""
    if _framework(x) == "torch":
        import torch

        t = x.detach().cpu().contiguous()
        size = t.element_size()
        ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
        return t.view(ints).numpy().view(f"u{size}").copy()
    a = np.array(x, copy=True)
    return np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}").reshape(a.shape)


def _diff(what: str, a: Any, b: Any) -> tuple[str, int, int, tuple[int, ...] | None]:
    ba, bb = bits(a), bits(b)
    if ba.shape != bb.shape or ba.dtype != bb.dtype:
        raise SpecError(f"{what}: the runs returned shape={ba.shape} and {bb.shape}, "
                        f"{ba.itemsize * 8}-bit and {bb.itemsize * 8}-bit values; a "
                        "bitwise check needs the same shape and dtype")
    ne = ba != bb
    first = tuple(int(i) for i in np.argwhere(ne)[0]) if ne.any() else None
    return what, int(ne.sum()), int(ne.size), first


def _grad_output(out: Any, grad_output: Any, seed: int) -> Any:
    shape = tuple(out.shape)
    g = (np.random.default_rng(seed).standard_normal(shape) if grad_output is None
         else grad_output)
    fw = _framework(out)
    if fw == "torch":
        import torch

        return torch.as_tensor(np.asarray(g) if not isinstance(g, torch.Tensor) else g
                               ).to(dtype=out.dtype, device=out.device)
    if fw == "jax":
        import jax.numpy as jnp

        return jnp.asarray(g).astype(out.dtype)
    return g


def _run(fn: Callable[..., Any], q: Any, k: Any, v: Any, kw: dict[str, Any],
         backward: bool, grad_output: Any, seed: int) -> tuple[Any, tuple[Any, ...]]:
    """(output, gradients) of one call: gradients (dq, dk, dv) by the kernel's
    autograd when ``backward`` and the inputs are torch or jax, else ()."""
    fw = _framework(q)
    if fw == "torch" and backward:
        import torch

        leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
        out = fn(*leaves, **kw)
        g = _grad_output(out, grad_output, seed)
        grads = torch.autograd.grad(out, leaves, grad_outputs=g, allow_unused=True)
        return out.detach(), tuple(torch.zeros_like(x) if d is None else d
                                   for x, d in zip(leaves, grads, strict=True))
    if fw == "jax" and backward:
        import jax

        out, vjp = jax.vjp(lambda a, b, c: fn(a, b, c, **kw), q, k, v)
        return out, tuple(vjp(_grad_output(out, grad_output, seed)))
    out = fn(q, k, v, **kw)
    return out, ()


def _finish(check: BitwiseCheck, raise_on_failure: bool) -> BitwiseCheck:
    if raise_on_failure and not check.passed:
        exc = AttentionMismatchError(check.report())
        exc.check = check  # type: ignore[attr-defined]
        raise exc
    return check


def check_deterministic(fn: Callable[..., Any], query: Any, key: Any, value: Any, *,
                        runs: int = 3, backward: bool = True, grad_output: Any = None,
                        seed: int = 0, raise_on_failure: bool = True,
                        **options: Any) -> BitwiseCheck:
    """Run ``fn(query, key, value, **options)`` ``runs`` times and check that every
    run's output and (torch, jax, ``backward=True``) gradients dq, dk, dv have the bits
    of the first run's.  ``grad_output``: fixed by ``seed`` unless given (the same
    for every run).  Returns a :class:`BitwiseCheck`; raises
    :class:`~mha_symbolic.errors.AttentionMismatchError` with its report when a bit
    differs (``raise_on_failure=False`` returns it).

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((1, 1, 4, 8))
    >>> def noisy(q, k, v):
    ...     return q + rng.standard_normal(q.shape) * 1e-12
    >>> check_deterministic(noisy, q, q, q, raise_on_failure=False).passed
    False
    """
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise SpecError(f"runs={runs!r} must be an integer >= 2")
    first_out, first_g = _run(fn, query, key, value, options, backward, grad_output, seed)
    findings = []
    for r in range(1, runs):
        out, grads = _run(fn, query, key, value, options, backward, grad_output, seed)
        findings.append(_diff(f"output (run {r} vs run 0)", first_out, out))
        for name, a, b in zip(("dq", "dk", "dv"), first_g, grads, strict=False):
            findings.append(_diff(f"{name} (run {r} vs run 0)", a, b))
    check = BitwiseCheck(all(f[1] == 0 for f in findings), "deterministic",
                         _framework(query), tuple(findings))
    return _finish(check, raise_on_failure)


def _take(x: Any, idx: list[int]) -> Any:
    """Batch elements ``idx`` of ``x`` (axis 0), in the array's own framework."""
    fw = _framework(x)
    if fw == "torch":
        import torch

        return x[torch.as_tensor(idx, device=x.device)]
    if fw == "jax":
        import jax.numpy as jnp

        return x[jnp.asarray(idx)]
    return np.asarray(x)[idx]


def check_batch_invariance(fn: Callable[..., Any], query: Any, key: Any, value: Any, *,
                           backward: bool = True, grad_output: Any = None, seed: int = 0,
                           elements: Any = None, batched_options: tuple[str, ...] = (),
                           raise_on_failure: bool = True, **options: Any) -> BitwiseCheck:
    """Check that batch element b of ``fn(query, key, value, **options)`` has the bits
    of ``fn`` on element b alone and on the batch in reverse order (its neighbours
    changed), forward and (torch, jax) backward.  The batch is axis 0 of every input
    and of the output; ``grad_output`` (fixed by ``seed`` unless given) is sliced the
    same way, so each element's gradients are those of the same loss.  ``elements``:
    the batch elements checked alone (default all); ``batched_options``: names of
    options with a batch axis 0 too (a per-batch ``attn_mask``), sliced alike.

    >>> import numpy as np
    >>> x = np.random.default_rng(1).standard_normal((3, 2, 4, 8))
    >>> def leaky(q, k, v):                       # element b depends on the batch mean
    ...     return q + 1e-9 * q.mean(axis=0)
    >>> check_batch_invariance(leaky, x, x, x, raise_on_failure=False).passed
    False
    """
    B = int(np.shape(query)[0]) if len(np.shape(query)) else 0
    if B < 2:
        raise SpecError(f"query.shape={tuple(np.shape(query))}: a batch invariance check "
                        "needs a batch axis 0 of at least 2 elements")
    for name in batched_options:
        if name not in options:
            raise SpecError(f"batched_options names {name!r}, which is not an option given")
    els = list(range(B)) if elements is None else [int(e) for e in elements]
    if any(not 0 <= e < B for e in els):
        raise SpecError(f"elements={elements!r}: every element must be in 0..{B - 1}")
    g_full = None
    full_out, full_g = _run(fn, query, key, value, options, False, None, seed)
    if backward:
        g_full = _grad_output(full_out, grad_output, seed)
        full_out, full_g = _run(fn, query, key, value, options, True, g_full, seed)

    def sub(idx: list[int]) -> tuple[Any, tuple[Any, ...]]:
        kw = {n: (_take(x, idx) if n in batched_options else x) for n, x in options.items()}
        g = None if g_full is None else _take(g_full, idx)
        return _run(fn, _take(query, idx), _take(key, idx), _take(value, idx), kw,
                    backward, g, seed)

    findings = []
    for b in els:
        out, grads = sub([b])
        findings.append(_diff(f"output[{b}] alone vs in the batch", _take(full_out, [b]), out))
        for name, a, d in zip(("dq", "dk", "dv"), full_g, grads, strict=False):
            findings.append(_diff(f"{name}[{b}] alone vs in the batch", _take(a, [b]), d))
    rev = list(range(B - 1, -1, -1))
    out, grads = sub(rev)
    findings.append(_diff("output, batch reversed vs in order", _take(full_out, rev), out))
    for name, a, d in zip(("dq", "dk", "dv"), full_g, grads, strict=False):
        findings.append(_diff(f"{name}, batch reversed vs in order", _take(a, rev), d))
    check = BitwiseCheck(all(f[1] == 0 for f in findings), "batch invariant",
                         _framework(query), tuple(findings))
    return _finish(check, raise_on_failure)
