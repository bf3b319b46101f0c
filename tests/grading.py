"""Grading helpers for the -m paper tests: a blank function fails with a message naming its
equation.

Each tests/test_<algo>.py names, in GRADED, the functions a student writes and the equation each
one is. During its -m paper tests, conftest.py's `graded` fixture puts `checked(...)` around each
of them, so that a stub (raise NotImplementedError, `pass`, or a constant such as torch.zeros(())
where a loss needs a gradient) fails with

    topr_loss: [TOPR] Eq. 8 not implemented: it returned a tensor with no gradient ...

instead of an error deep inside torch. A function that is written gives its result unchanged.
"""
import functools

import pytest
import torch


def _tensors(value):
    """The tensors in a result: the tensor itself, or those in a tuple or list."""
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return [value] if isinstance(value, torch.Tensor) else []


def checked(fn, name: str, equation: str, grad: bool = False):
    """fn, which fails the test with a message naming `equation` when fn is still blank: it raises
    NotImplementedError, returns None, returns no tensor though it was given tensors, or (grad=True,
    for a loss or anything the gradient flows through) returns tensors with no gradient though its
    inputs have one."""
    def missing(what):
        pytest.fail(f"{name}: {equation} not implemented: {what}", pytrace=False)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            out = fn(*args, **kwargs)
        except NotImplementedError:
            missing("it raises NotImplementedError")
        inputs = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
        if out is None:
            missing("it returned None (a `pass` or a missing `return`?)")
        if inputs and not _tensors(out):
            missing(f"it returned {type(out).__name__} {out!r:.60}, not a tensor")
        if (grad and torch.is_grad_enabled() and any(a.requires_grad for a in inputs)
                and not any(t.requires_grad for t in _tensors(out))):
            missing("it returned a tensor with no gradient, though its input has one (a constant "
                    "such as torch.zeros? or a .detach() too many)")
        return out
    return call
