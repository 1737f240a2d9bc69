"""Lossless weight deltas between checkpoints (docs/delta-format.md).

Paths are .safetensors files or sharded folders; outputs appear atomically
after verification."""
import ctypes

from . import _lib
from ._lib import check, fspath, lib

_STATS = ("target_bytes", "delta_bytes", "units", "changed", "tensors_diff", "tensors_whole")
_ENCODINGS = ("SAME", "SPARSE", "DENSE", "RAW", "ZSTD")


def make(base, new, out):
    """Encodes the delta base -> new into the file `out` and returns its
    statistics: {"target_bytes", "delta_bytes", "units", "changed",
    "tensors_diff", "tensors_whole", "chunks": {encoding: count}}."""
    # delta_stats is read by its leading fields from a buffer with room to
    # spare, so a library that adds fields at its end stays safe to call.
    buf = (ctypes.c_uint64 * 64)()
    check(lib.delta_make(fspath(base), fspath(new), fspath(out), None, buf))
    st = {k: int(buf[i]) for i, k in enumerate(_STATS)}
    st["chunks"] = {e: int(buf[len(_STATS) + i]) for i, e in enumerate(_ENCODINGS)}
    return st


def apply(base, delta, out):
    """Applies the delta file `delta` to `base`, writing the rebuilt
    checkpoint to `out` (checked against the digests the delta records).
    Returns `out`."""
    check(lib.delta_apply(fspath(base), fspath(delta), fspath(out), None))
    return out


def inspect(delta):
    """A per-tensor summary of a delta file: {"version", "base_digest",
    "target_digest", "bytes", "sharded", "tensors": [{"name", "mode",
    "dtype", "nbytes", "changed_fraction", "bytes", "encodings"}]}."""
    j = ctypes.c_void_p()
    check(lib.delta_inspect(fspath(delta), ctypes.byref(j)))
    return _lib.take_json_value(j)


def xor_zstd1(base, new, threads=0):
    """The baseline deltas are measured against (what `shoal bench delta`
    calls xor+zstd-1): the bytes of new's tensors XORed with base's
    same-named tensors, compressed by zstd level 1 in 8 MiB blocks, plus a
    16-byte hash.  Returns that size in bytes."""
    a, b = ctypes.c_void_p(), ctypes.c_void_p()
    try:
        check(lib.ckpt_open(fspath(base), ctypes.byref(a)))
        check(lib.ckpt_open(fspath(new), ctypes.byref(b)))
        n = ctypes.c_uint64()
        check(lib.delta_baseline_xor_zstd(a, b, int(threads), ctypes.byref(n)))
        return n.value
    finally:
        lib.ckpt_close(a)
        lib.ckpt_close(b)
