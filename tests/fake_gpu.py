"""A second device on a CPU-only machine for tests/test_devices.py: "gpu", a CPU tensor in disguise.

`with fake_gpu.on():` a tensor moved or made on torch.device("gpu") (`.to(device)`, `device=`)
computes on the CPU but reports device gpu:0, and an op that mixes it with a real CPU tensor
raises "Expected all tensors to be on the same device", as CUDA does. So a training step that
runs here with its model on "gpu" places every tensor the way it must on a GPU.

Why not torch's FakeTensorMode with a fake "cuda": it computes no values (`loss.item()` fails)
and on a CPU-only build its backward pass aborts ("PyTorch is not linked with support for cuda
devices"). PyTorch's PrivateUse1 slot, registered from Python, gives the autograd engine a device
guard for "gpu", so backward runs; the values are real, so a step on "gpu" can be compared with
the same step on the CPU. As on CUDA, a 0-dim CPU tensor may meet a gpu tensor (a scalar), an
index may be a CPU tensor, and copy_ may cross devices.
"""
import contextlib

import torch
import torch.utils.backend_registration as registration
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

NAME = "gpu"
aten = torch.ops.aten
# ops that accept tensors of two devices on CUDA too: a cross-device copy, CPU indices
MIXING_ALLOWED = {aten.copy_.default, aten._to_copy.default}
INDEX_OPS = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default,
             aten._index_put_impl_.default}


class _Backend:
    """What torch asks of a device module: AMP's dtypes, and no more."""
    @staticmethod
    def get_amp_supported_dtype():
        return [torch.bfloat16, torch.float16]

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def current_device():
        return 0

    @staticmethod
    def device_count():
        return 1

    @staticmethod
    def _is_in_bad_fork():
        return False

    @staticmethod
    def manual_seed_all(seed):
        pass


def _register() -> None:
    """The "gpu" device; tensors that C++ makes on it directly (torch.tensor(data, device=...), a
    list index) start as an empty GPUTensor, which the caller fills by copy_."""
    global _library
    registration._setup_privateuseone_for_python_backend(NAME, backend_module=_Backend())
    _library = torch.library.Library("aten", "IMPL")
    _library.impl("empty_strided", _empty_strided, "PrivateUse1")
    _library.impl("empty.memory_format", _empty, "PrivateUse1")
    _library.impl("_copy_from", _copy_from, "PrivateUse1")


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return GPUTensor(torch.empty_strided(size, stride, dtype=dtype))


def _copy_from(src, dst, non_blocking=False):
    _unwrap(dst).copy_(_unwrap(src))
    return dst


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return GPUTensor(torch.empty(size, dtype=dtype, memory_format=memory_format))


class GPUTensor(torch.Tensor):
    """A CPU tensor `elem` that reports device gpu:0."""

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, device=DEVICE, requires_grad=elem.requires_grad)

    def __init__(self, elem: torch.Tensor):
        self.elem = elem

    def __repr__(self):
        return f"GPUTensor({self.elem!r})"

    # a traceable wrapper subclass: Module.to() then swaps each parameter in place, so that tied
    # weights (the tiny model's embedding and output layer) stay one parameter, as on CUDA
    def __tensor_flatten__(self):
        return ["elem"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return GPUTensor(inner["elem"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        with _Mode():
            return func(*args, **(kwargs or {}))


def _device_kwarg(kwargs) -> str | None:
    device = kwargs.get("device")
    return None if device is None else torch.device(device).type


class _Mode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is aten._fused_sdp_choice.default:
            return 0  # SDPBackend.MATH: plain ops, which run on the CPU tensors inside
        leaves = tree_leaves((args, kwargs))
        on_gpu = any(isinstance(t, GPUTensor) for t in leaves)
        target = _device_kwarg(kwargs)
        if on_gpu and func not in MIXING_ALLOWED:
            checked = tree_leaves((args[:1] + args[2:], kwargs)) if func in INDEX_OPS else leaves
            host = [t for t in checked if type(t) in (torch.Tensor, torch.nn.Parameter)
                    and t.device.type == "cpu" and t.dim() > 0]
            if host:
                raise RuntimeError(f"Expected all tensors to be on the same device, but found at "
                                   f"least two devices, {NAME}:0 and cpu! ({func})")
        if target == NAME:
            kwargs["device"] = torch.device("cpu")
        originals = {id(t.elem): t for t in leaves if isinstance(t, GPUTensor)}
        out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
        if target == "cpu" or not (on_gpu or target == NAME):
            return out
        def wrap(t):  # an in-place op returns its own argument
            if not isinstance(t, torch.Tensor):
                return t
            return originals[id(t)] if id(t) in originals else GPUTensor(t)
        return tree_map(wrap, out)


class _ToList(TorchFunctionMode):
    """.tolist() refuses tensor subclasses: a copy to the host, as CUDA makes."""
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.tolist:
            return _unwrap(args[0]).tolist()
        return func(*args, **(kwargs or {}))


def _unwrap(t):
    return t.elem if isinstance(t, GPUTensor) else t


# At import, before any backward pass of the process: the autograd engine counts each device's
# queues once, at its first backward.
_register()
DEVICE = torch.device(NAME, 0)


@contextlib.contextmanager
def on():
    """Within: torch.device("gpu") is a device; yields it."""
    with _ToList(), _Mode():
        yield DEVICE


def on_cpu(t: torch.Tensor) -> torch.Tensor:
    """A detached CPU copy, whichever device `t` is on."""
    return _unwrap(t).detach().clone()
