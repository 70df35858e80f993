"""One call that tests an attention kernel forward and backward: :func:`check_attention`.

The kernel runs on the caller's tensors; for torch tensors and jax arrays its
gradients come from its own autograd (``torch.autograd.grad``, ``jax.vjp``) against a
``grad_output``; the output is judged by :func:`~mha_symbolic.compare_attention` and
the gradients by :func:`~mha_symbolic.compare_attention_backward`, against the exact
answers.  numpy kernels have no autograd: only their output is checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._display import ReportDisplay
from ..errors import OptionalDependencyError, SpecError
from ..oracle.layout import check_layout, swap_layout
from ..oracle.variants.registry import variant_keywords, variant_options
from .backward.compare import BackwardComparison, compare_attention_backward
from .forward.compare import compare_attention
from .integrity import Guard
from .options import Msg, mismatch_error, passes_options_to
from .report import headline
from .verdict import AttentionComparison

__all__ = ["AttentionCheck", "check_attention"]

# options of the reference that a scaled_dot_product_attention-like kernel also takes
_FORWARD_OPTIONS = ("attn_mask", "is_causal", "scale", "enable_gqa")
# options of the tolerance, shared by the output and the gradients (one error model:
# the same defaults, testing/tolerance.py)
_TOLERANCE_OPTIONS = ("rule", "accumulation_dtype", "error_model", "safety", "rtol", "atol",
                      "ulps", "factor", "diagnose_bugs")
# options of the forward model only (what the kernel rounds in the forward pass)
_FORWARD_TOLERANCE_OPTIONS = ("kernel", "subnormals", "lse_base", "lse_masked")


@dataclass(frozen=True, repr=False)
class AttentionCheck(ReportDisplay):
    """What :func:`check_attention` found: ``output`` (an AttentionComparison),
    ``backward`` (a BackwardComparison, or None when the kernel has no autograd),
    the ``framework`` ("torch", "jax", "numpy") and the ``grad_output`` used."""

    passed: bool
    framework: str
    output: AttentionComparison
    backward: BackwardComparison | None
    grad_output: Any  # the gradient of the output used (a tensor/array), None for numpy
    #: what the kernel did besides its output (:mod:`.integrity`): inputs mutated in
    #: place, an output sharing memory with an input; any of them fails the check
    integrity: tuple[str, ...] = ()
    #: why the gradients were not checked although the kernel has autograd (a variant
    #: whose gradients are not certified: rotary embeddings), or ""
    no_gradients: str = ""

    def __bool__(self) -> bool:
        return self.passed

    def summary(self) -> str:
        """One line: the verdict and the summary of what failed (or of everything)."""
        head = "attention kernel passed" if self.passed else "attention kernel FAILED"
        parts = [*self.integrity] + [c.summary() for c in (self.output, self.backward)
                                     if c is not None and (self.passed or not c.passed)]
        return f"{head} ({self.framework}): " + "; ".join(parts)

    def headline(self) -> str:
        """The first line of a failure: ``FAIL [bug class] <framework> kernel: …``."""
        if self.integrity:
            return headline(["integrity"], f"{self.framework} kernel",
                            "mutated its inputs" if "mutated" in self.integrity[0]
                            else "output aliases an input")

        parts = [c for c in (self.output, self.backward) if c is not None and not c.passed]
        run = any(c.diagnosis_run or c.diagnoses for c in parts)
        bugs = [d.bug for c in parts for d in c.diagnoses] if run else None
        detail = ", ".join(
            f"output {c.n_mismatched} / {c.n_elements}" if c is self.output else
            ", ".join(f"{g.title} {g.n_mismatched} / {g.n_elements}"
                      for g in c.gradients.values() if not g.passed)  # type: ignore[union-attr]
            for c in parts) + " off"
        return headline(bugs, f"{self.framework} kernel", detail)

    def report(self) -> str:
        what = ("(output" + (" and gradients" if self.backward is not None else
                             " only: no autograd") + " checked against the exact answers)")
        if self.no_gradients:
            what = ("(output checked against the exact answer; gradients not checked: "
                    f"{self.no_gradients})")
        lines = ([] if self.passed else [self.headline()]) + [self.summary(), what, "",
                                                              self.output.report()]
        if self.backward is not None:
            lines += ["", self.backward.report()]
        return "\n".join(lines)

    def table(self) -> tuple[tuple[str, ...], list[tuple[str, str]]]:
        """(header, rows) of the notebook display: the output and the gradients."""
        rows = [("integrity", p) for p in self.integrity] + [("output", self.output.summary())]
        if self.backward is not None:
            rows.append(("gradients", self.backward.summary()))
        return ("checked", "finding"), rows


def _uncertified_gradients(variants: dict[str, Any]) -> str:
    """The reason the gradients cannot be judged with these variants, or ""."""
    opts = variant_options(**variants) if variants else None
    names = [v.name for v in (opts.active() if opts is not None else ()) if not v.gradients]
    return (f"gradients with {', '.join(names)} are not certified yet" if names else "")


def _framework(x: Any) -> str:
    module = type(x).__module__ or ""
    if module.startswith("torch"):
        return "torch"
    if module.startswith(("jax", "jaxlib")):
        return "jax"
    return "numpy"


def _default_grad_output(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Standard normal values, fixed by ``seed`` (float64; cast to the output's dtype)."""
    return np.random.default_rng(seed).standard_normal(shape)


@passes_options_to(compare_attention, _TOLERANCE_OPTIONS + _FORWARD_TOLERANCE_OPTIONS
                   + variant_keywords())
def check_attention(
    fn: Any, query: Any, key: Any, value: Any, *,
    grad_output: Any = None,
    attn_mask: Any = None, is_causal: bool = False, scale: float | None = None,
    enable_gqa: bool = False, causal_alignment: str = "top_left", masked_rows: str = "zero",
    dropout_p: float = 0.0, dropout_mask: Any = None,
    pass_options: bool = True, raise_on_failure: bool = True, seed: int = 0,
    layout: str = "bhsd", returns_lse: bool = False, msg: Msg = None, **tolerance: Any,
) -> AttentionCheck:
    """Run ``fn(query, key, value, **options)`` forward and (torch, jax) backward and
    check its output and every gradient against the exact answers in one call.

    ``options`` are the scaled_dot_product_attention options given here (``attn_mask``,
    ``is_causal``, ``scale``, ``enable_gqa``; only those passed, and none with
    ``pass_options=False`` — then ``fn`` must apply them itself).  ``causal_alignment``,
    ``masked_rows`` and dropout (``dropout_p`` with the kernel's ``dropout_mask``)
    describe the exact answer only.  ``grad_output``: the gradient of the output;
    by default standard normal values fixed by ``seed``, in the output's dtype.
    The variants (the registered variants' keywords: ``window``, ``softcap``,
    ``alibi_slopes``, ``sinks``, ``mask_mod``, ``score_mod``, FP8 descale, as
    :func:`mha_symbolic.reference_attention`) describe the exact
    answer only: ``fn`` applies them itself (a ``functools.partial`` or a lambda around
    the kernel); the gradients are judged as
    :func:`~mha_symbolic.compare_attention_backward` judges them (which refuses a call
    it has no model for, rather than judge the output alone).
    ``tolerance``: ``rule``, ``accumulation_dtype``, ``error_model``, ``safety``,
    ``rtol``, ``atol``, ``ulps``, ``factor``, ``diagnose_bugs`` (as compare_attention,
    for the output and the gradients), ``kernel`` and ``subnormals`` (the output's
    model only).  ``layout="bshd"``: ``fn`` takes and returns FlashAttention's
    (B, S, H, D) layout (its gradients too); the output's report keeps that layout,
    the gradients' report names (batch, head, query, feature).  ``returns_lse=True``:
    ``fn`` returns ``(output, softmax_lse)`` (FlexAttention's ``return_lse``); the LSE is
    judged too (``lse_base``, ``lse_masked`` as compare_attention's).

    Returns an :class:`AttentionCheck`; raises
    :class:`~mha_symbolic.errors.AttentionMismatchError` with both reports when it
    fails (first line: the one-line summary; ``msg`` as
    :func:`~mha_symbolic.assert_attention_close`'s; ``raise_on_failure=False`` returns
    it instead).  The kernel's inputs are snapshotted and checked unchanged after the
    call, and an output sharing memory with an input is refused (:mod:`.integrity`):
    either fails the check.

    >>> import torch, torch.nn.functional as F
    >>> q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    >>> check_attention(F.scaled_dot_product_attention, q, k, v, is_causal=True).passed
    True
    """
    __tracebackhide__ = True
    check_layout(layout)
    shared = {k_: v_ for k_, v_ in tolerance.items() if k_ in _TOLERANCE_OPTIONS}
    given = {"attn_mask": attn_mask, "is_causal": is_causal, "scale": scale,
             "enable_gqa": enable_gqa}
    defaults = {"attn_mask": None, "is_causal": False, "scale": None, "enable_gqa": False}
    fwd_opts = {k_: v_ for k_, v_ in given.items() if pass_options and v_ is not defaults[k_]}
    ref_opts = dict(given, causal_alignment=causal_alignment, masked_rows=masked_rows)
    variants = {k_: tolerance.pop(k_) for k_ in variant_keywords() if k_ in tolerance}
    variants = {k_: v_ for k_, v_ in variants.items() if v_ is not None}
    ref_opts.update(variants)
    framework = _framework(query)
    box: dict[str, Any] = {}
    guard = Guard()
    fn = guard.wrap(_lse_capturing(fn, box) if returns_lse else fn)
    out, (dq, dk, dv, dmask), do_np = _run(framework, fn, query, key, value, attn_mask,
                                           grad_output, fwd_opts, seed)
    if guard.problems and framework == "numpy" and guard.before is not None:
        query, key, value = guard.before   # judged against the inputs as they were
    fwd_kw = dict(ref_opts)
    if dropout_mask is not None or dropout_p:
        fwd_kw.update(dropout_p=dropout_p, dropout_mask=dropout_mask)
    lse = box.get("lse")
    if lse is not None and hasattr(lse, "detach"):
        lse = lse.detach()
    output = compare_attention(out, query, key, value, **fwd_kw, layout=layout, lse=lse,
                               **tolerance)
    backward = None
    skip = _uncertified_gradients(variants)
    if dq is not None and not skip:
        dq, dk, dv, do_b, q_b, k_b, v_b = (swap_layout(x, layout, "gradient") for x in (
            dq, dk, dv, do_np, query, key, value))
        backward = compare_attention_backward(
            dq, dk, dv, q_b, k_b, v_b, do_b, **ref_opts, dropout_p=dropout_p,
            dropout_mask=dropout_mask, d_attn_mask=dmask, **shared)
    passed = bool(output.passed and (backward is None or backward.passed)
                  and not guard.problems)
    result = AttentionCheck(passed, framework, output, backward, do_np,
                            tuple(dict.fromkeys(guard.problems)),
                            skip if dq is not None else "")
    if raise_on_failure and not passed:
        raise mismatch_error(result, msg, attribute="check") from None
    return result


def _lse_capturing(kernel: Any, box: dict[str, Any]) -> Any:
    """``kernel`` returning ``(output, softmax_lse)`` wrapped to return the output alone,
    the LSE kept in ``box["lse"]``."""
    def fn(*args: Any, **kwargs: Any) -> Any:
        res = kernel(*args, **kwargs)
        if not isinstance(res, (tuple, list)) or len(res) < 2:
            raise SpecError(f"returns_lse=True but fn returned {type(res).__name__}: "
                            "expected (output, softmax_lse)")
        box["lse"] = res[1]
        return res[0]
    return fn


def _run(framework: str, fn: Any, query: Any, key: Any, value: Any, attn_mask: Any,
         grad_output: Any, opts: dict[str, Any], seed: int
         ) -> tuple[Any, tuple[Any, Any, Any, Any], Any]:
    """``fn`` run forward and, for torch and jax, backward: (output, (dq, dk, dv,
    d_attn_mask), the gradient of the output used); None where not computed."""
    if framework == "torch":
        return _run_torch(fn, query, key, value, attn_mask, grad_output, opts, seed)
    if framework == "jax":
        out, (dq, dk, dv), do_used = _run_jax(fn, query, key, value, grad_output, opts, seed)
        return out, (dq, dk, dv, None), do_used
    return fn(query, key, value, **opts), (None, None, None, None), None


def _run_torch(fn: Any, query: Any, key: Any, value: Any, attn_mask: Any, grad_output: Any,
               opts: dict[str, Any], seed: int) -> tuple[Any, tuple[Any, ...], Any]:
    import torch

    leaves = [x.detach().clone().requires_grad_(True) for x in (query, key, value)]
    mask_leaf = None
    if (attn_mask is not None and _framework(attn_mask) == "torch"
            and attn_mask.is_floating_point() and attn_mask.requires_grad):
        mask_leaf = attn_mask.detach().clone().requires_grad_(True)
        opts = {**opts, "attn_mask": mask_leaf}
    out = fn(*leaves, **opts)
    if not isinstance(out, torch.Tensor):
        raise SpecError(f"fn returned {type(out).__name__}: expected one torch.Tensor (the "
                        "attention output)")
    if grad_output is None:
        g = torch.from_numpy(_default_grad_output(tuple(out.shape), seed)).to(out.dtype)
        g = g.to(out.device)
    else:
        g = torch.as_tensor(grad_output).to(dtype=out.dtype, device=out.device)
    inputs = [*leaves] + ([mask_leaf] if mask_leaf is not None else [])
    grads = torch.autograd.grad(out, inputs, grad_outputs=g, allow_unused=True)
    grads = tuple(torch.zeros_like(x) if gr is None else gr for x, gr in zip(inputs, grads,
                                                                             strict=True))
    dmask = grads[3] if mask_leaf is not None else None
    return out.detach(), (*grads[:3], dmask), g.detach()


def _run_jax(fn: Any, query: Any, key: Any, value: Any, grad_output: Any,
             opts: dict[str, Any], seed: int) -> tuple[Any, tuple[Any, ...], Any]:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:  # pragma: no cover - a jax array implies jax is installed
        raise OptionalDependencyError("jax", "check_attention on jax arrays", "jax") from None

    out, vjp = jax.vjp(lambda a, b, c: fn(a, b, c, **opts), query, key, value)
    if grad_output is None:
        g = jnp.asarray(_default_grad_output(tuple(out.shape), seed)).astype(out.dtype)
    else:
        g = jnp.asarray(grad_output).astype(out.dtype)
    return out, tuple(vjp(g)), g
