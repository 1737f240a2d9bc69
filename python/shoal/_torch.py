"""torch <-> safetensors dtypes, tensor specs for publishing, and read-only
zero-copy views over a leased image.  Imported only when tensors are used."""
import ctypes

import torch

from .errors import ShoalError

# torch dtype -> safetensors dtype name, for publishing.  Written straight
# from the tensor's memory: no Python-side copy.
TO_NAME = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16",
    torch.float16: "F16", torch.bfloat16: "BF16", torch.int32: "I32", torch.float32: "F32",
    torch.complex64: "C64", torch.float64: "F64", torch.int64: "I64",
}
# safetensors dtype name -> torch dtype, for views.  torch 1.13 has no
# unsigned 16/32/64-bit or 8-bit float types: those come back as the signed
# integer (or uint8) type of the same width, holding the same bits.
FROM_NAME = {v: k for k, v in TO_NAME.items()}
FROM_NAME.update({"U16": torch.int16, "U32": torch.int32, "U64": torch.int64,
                  "F8_E4M3": torch.uint8, "F8_E5M2": torch.uint8, "F8_E8M0": torch.uint8})


def dedup(items):
    """Splits (name, tensor) pairs into those to store and {alias: stored
    name} for tensors that are exactly another's memory (same address,
    dtype, shape and strides: tied weights, state_dict entries of one
    parameter), so that those are stored and sent once.  Tensors that only
    overlap (two slices of one buffer) are stored each.  Names are checked
    here, before anything is written."""
    keep, aliases, seen = [], {}, {}
    for name, t in items:
        if not isinstance(name, str):
            raise TypeError("shoal.Store.publish: tensor names must be str, got %r" % (name,))
        if "\0" in name:
            raise ShoalError(-1, "tensor %r: the name holds a NUL character (C would cut it "
                             "to %r)" % (name, name.split("\0")[0]))
        key = None
        if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.numel() and \
                not t.is_conj() and not t.is_neg():
            key = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))
        if key is not None and key in seen:
            aliases[name] = seen[key]
            continue
        if key is not None:
            seen[key] = name
        keep.append((name, t))
    return keep, aliases


_MADV_HUGEPAGE = 14
_libc = None


def _huge_pages(b):
    """Asks for transparent huge pages under a new snapshot buffer before
    its first copy faults it in: 512 times fewer page faults, which cost
    some 20 us each in a VM (0.5 s for a 141 MB model in 4 KiB pages).
    Advice only: nothing changes where the kernel does not take it."""
    global _libc
    n = b.numel() * b.element_size()
    if n < (4 << 20):
        return
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        huge = 2 << 20
        lo = (b.data_ptr() + huge - 1) // huge * huge
        hi = (b.data_ptr() + n) // huge * huge
        if hi > lo:
            _libc.madvise(lo, hi - lo, _MADV_HUGEPAGE)
    except (OSError, AttributeError):
        pass


def snapshot(items, bufs):
    """Copies (name, tensor) pairs into the reusable buffers `bufs` (name ->
    tensor, updated in place) and returns ({name: buffer}, event): event is
    a CUDA event to wait on before reading the buffers when any tensor was
    on a GPU (copied asynchronously into pinned memory), else None.  A lazy
    conjugate or negative view is resolved by the copy; a non-contiguous
    tensor becomes contiguous."""
    out, cuda = {}, False
    names = set()
    with torch.no_grad():
        for name, t in items:
            if not isinstance(t, torch.Tensor):
                raise ShoalError(-1, "tensor %s: expected a torch.Tensor, got %s" % (name, type(t).__name__))
            if t.layout != torch.strided:
                raise ShoalError(-1, "tensor %s: layout %s has no flat memory to publish; publish "
                                 "t.to_dense()" % (name, t.layout))
            if t.dtype not in TO_NAME:
                raise ShoalError(-1, "tensor %s: dtype %s has no safetensors equivalent; use one of %s"
                                 % (name, t.dtype, ", ".join(str(d) for d in TO_NAME)))
            b = bufs.get(name)
            on_gpu = t.device.type == "cuda"
            if b is None or b.shape != t.shape or b.dtype != t.dtype:
                b = torch.empty(t.shape, dtype=t.dtype, pin_memory=on_gpu)
                if not on_gpu:
                    _huge_pages(b)
                bufs[name] = b
            if not on_gpu and t.device.type == "cpu" and t.is_contiguous() and not t.is_conj() \
                    and not t.is_neg() and t.numel():
                # One memcpy on this thread: torch's copy_ wakes its OpenMP
                # pool, whose threads then spin on the cores the encoder
                # needs.
                ctypes.memmove(b.data_ptr(), t.data_ptr(), t.numel() * t.element_size())
            else:
                b.copy_(t, non_blocking=on_gpu)
            cuda = cuda or on_gpu
            out[name] = b
            names.add(name)
        for stale in [k for k in bufs if k not in names]:
            del bufs[stale]
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record()
    return out, event


def spec_of(name, t, codes, CkptTensor):
    """A ckpt_tensor pointing at t's memory (t must stay alive while it is
    used)."""
    if not isinstance(t, torch.Tensor):
        raise ShoalError(-1, "tensor %s: expected a torch.Tensor, got %s" % (name, type(t).__name__))
    if t.layout != torch.strided:
        raise ShoalError(-1, "tensor %s: layout %s has no flat memory to publish; publish "
                         "t.to_dense()" % (name, t.layout))
    if t.device.type != "cpu":
        raise ShoalError(-1, "tensor %s: on %s; publish CPU tensors (call .cpu() first)" % (name, t.device))
    if t.dtype not in TO_NAME:
        raise ShoalError(-1, "tensor %s: dtype %s has no safetensors equivalent; use one of %s"
                         % (name, t.dtype, ", ".join(str(d) for d in TO_NAME)))
    # A lazily conjugated or negated view (x.conj(), torch._neg_view) shares
    # the memory of x and only flags the sign: its bytes hold x's values,
    # which the library would publish as if they were the view's.
    if t.is_conj() or t.is_neg():
        raise ShoalError(-1, "tensor %s: a lazily %s view, whose memory holds the values before "
                         "it; publish t.resolve_conj().resolve_neg() (a copy)"
                         % (name, "conjugated" if t.is_conj() else "negated"))
    if not t.is_contiguous():
        raise ShoalError(-1, "tensor %s: not contiguous; publish t.contiguous() (a copy) "
                         "or a contiguous tensor" % name)
    if t.dim() > 16:
        raise ShoalError(-1, "tensor %s: %d dimensions; safetensors allows at most 16" % (name, t.dim()))
    s = CkptTensor()
    s.name = name.encode("utf-8")
    s.dtype = codes[TO_NAME[t.dtype]]
    s.ndim = t.dim()
    for i, d in enumerate(t.shape):
        s.shape[i] = d
    s.data = t.data_ptr() if t.numel() else None
    s.nbytes = t.numel() * t.element_size()
    return s


class ReadOnlyTensor(torch.Tensor):
    """A view over a replica's mapped image, whose pages are read-only.
    Every torch operation works on it; an in-place one (add_, copy_,
    __setitem__, out=...) that would write into it raises ShoalError instead
    of crashing the process.  Views of it (t[0], t.view(...), t.T) stay
    read-only; results of computations are ordinary tensors."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        writes = (name.endswith("_") and not name.endswith("__")) or name in (
            "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
            "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__",
            "__imatmul__", "set_", "resize_")
        target = args[0] if args else None
        if writes and isinstance(target, ReadOnlyTensor):
            raise ShoalError(-12, "tensor view: %s would write into a replica's read-only "
                             "image; use .clone() for a writable copy" % name)
        outs = kwargs.get("out")
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        if any(isinstance(o, ReadOnlyTensor) for o in outs):
            raise ShoalError(-12, "tensor view: out= names a replica's read-only image")
        with torch._C.DisableTorchFunction():
            ret = func(*args, **kwargs)
        if isinstance(target, ReadOnlyTensor):
            return _keep_views(ret, target)
        return ret


def _keep_views(ret, src):
    """Results that share src's memory stay read-only; others become plain."""
    if isinstance(ret, torch.Tensor):
        if isinstance(ret, ReadOnlyTensor) or _shares(ret, src):
            return ret.as_subclass(ReadOnlyTensor)
        return ret
    if isinstance(ret, (tuple, list)):
        return type(ret)(_keep_views(r, src) for r in ret)
    return ret


def _shares(a, b):
    with torch._C.DisableTorchFunction():
        try:
            return a.storage().data_ptr() == b.storage().data_ptr() and a.numel() > 0
        except Exception:
            return False


def view(ptr, nbytes, dtype_name, shape, owner):
    """A read-only torch view of nbytes at ptr; `owner` (the lease) is kept
    alive for as long as the view or any view of it is."""
    tdtype = FROM_NAME.get(dtype_name)
    if tdtype is None or dtype_name in ("F4", "F6_E2M3", "F6_E3M2"):
        # Sub-byte or unknown types: the raw bytes.
        tdtype, shape = torch.uint8, (nbytes,)
    if nbytes == 0:
        return torch.empty(shape, dtype=tdtype).as_subclass(ReadOnlyTensor)
    buf = (ctypes.c_uint8 * nbytes).from_address(ptr)
    buf._shoal_owner = owner  # torch keeps buf alive, buf keeps the lease
    with torch._C.DisableTorchFunction():
        t = torch.frombuffer(buf, dtype=torch.uint8).view(tdtype).view(tuple(shape))
    return t.as_subclass(ReadOnlyTensor)
