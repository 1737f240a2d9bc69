"""Loading libshoal.so and declaring the C functions the package calls.

The package is pure Python over the shared library (ctypes).  It crosses the
C boundary with pointers, integers and JSON text only, except for one struct,
``ckpt_tensor``, whose size the library reports so that a mismatch between
this file and the library is caught at import instead of corrupting memory.
"""
import ctypes
import ctypes.util
import atexit
import json
import logging
import os

from .errors import ShoalError, error_for

_c = ctypes
u64, i64, i32, sz = _c.c_uint64, _c.c_int64, _c.c_int, _c.c_size_t
vp, cp = _c.c_void_p, _c.c_char_p

CKPT_MAX_DIMS = 16


class CkptTensor(_c.Structure):
    """Mirror of ``ckpt_tensor`` in include/shoal/ckpt.h."""
    _fields_ = [("name", cp), ("dtype", i32), ("ndim", i32), ("shape", i64 * CKPT_MAX_DIMS),
                ("numel", u64), ("nbytes", u64), ("file", _c.c_uint32), ("offset", u64),
                ("data", vp)]


class StoreLease(_c.Structure):
    """The leading fields of ``store_lease`` (include/shoal/store.h); the
    lease is allocated by the library, so fields it may add later are never
    touched here."""
    _fields_ = [("version", u64), ("data", vp), ("size", u64), ("ckpt", vp)]


def _candidates():
    env = os.environ.get("SHOAL_LIB")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    # A wheel (`pip install .`) carries the library beside the package.
    yield os.path.join(here, "libshoal.so.0")
    try:
        from . import _libdir  # written by `make install`
        yield os.path.join(_libdir.LIBDIR, "libshoal.so.0")
    except ImportError:
        pass
    # From the source tree: python/shoal -> build/libshoal.so.0
    yield os.path.join(here, "..", "..", "build", "libshoal.so.0")
    found = ctypes.util.find_library("shoal")
    if found:
        yield found


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path + " (missing)")
            continue
        try:
            return _c.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise ImportError("shoal: cannot load libshoal.so: tried %s; run `make` in the shoal tree, "
                      "`make install PREFIX=...`, or set SHOAL_LIB to the library's path"
                      % (", ".join(tried) or "nothing"))


lib = _load()

_PROTOS = {
    # common
    "sh_errmsg": (cp, []),
    "sh_strerror": (cp, [i32]),
    "sh_free": (None, [vp]),
    "sh_json_take_text": (i32, [vp, _c.POINTER(vp)]),
    "sh_version": (cp, []),
    "sh_log_set_sink": (None, [vp, vp]),
    # ckpt
    "ckpt_dtype_name": (cp, [i32]),
    "ckpt_open": (i32, [cp, _c.POINTER(vp)]),
    "ckpt_close": (None, [vp]),
    "ckpt_count": (sz, [vp]),
    "ckpt_tensor_at": (_c.POINTER(CkptTensor), [vp, sz]),
    "ckpt_tensor_sizeof": (sz, []),
    "ckpt_meta": (cp, [vp, cp]),
    # delta
    "delta_make": (i32, [cp, cp, cp, vp, vp]),
    "delta_apply": (i32, [cp, cp, cp, vp]),
    "delta_inspect": (i32, [cp, _c.POINTER(vp)]),
    "delta_baseline_xor_zstd": (i32, [vp, vp, i32, _c.POINTER(u64)]),
    # store
    "store_open": (i32, [cp, cp, i32, _c.POINTER(vp)]),
    "store_close": (None, [vp]),
    "store_claim_publisher": (i32, [vp, cp]),
    "store_publish_keep": (i32, [vp, i32, i32]),
    "store_latest": (i32, [vp, _c.POINTER(u64)]),
    "store_publish_path": (i32, [vp, cp, u64, _c.POINTER(u64)]),
    "store_publish_tensors": (i32, [vp, _c.POINTER(CkptTensor), sz, u64, _c.POINTER(u64)]),
    "store_publish_tensors_meta": (i32, [vp, _c.POINTER(CkptTensor), sz, cp, u64, _c.POINTER(u64)]),
    "store_list_json": (i32, [vp, _c.POINTER(vp)]),
    "store_materialize": (i32, [vp, u64, u64, cp, cp]),
    # replicas
    "store_replica_open_json": (i32, [cp, _c.POINTER(vp)]),
    "store_replica_close_json": (None, [vp]),
    "store_replica_version": (u64, [vp]),
    "store_replica_wait": (i32, [vp, u64, _c.c_double]),
    "store_replica_info_json": (i32, [vp, _c.POINTER(vp)]),
    "store_lease_new": (i32, [vp, u64, u64, _c.POINTER(_c.POINTER(StoreLease))]),
    "store_lease_free": (u64, [vp, _c.POINTER(StoreLease)]),
    "store_lease_drop_pages": (i32, [_c.POINTER(StoreLease), u64, u64]),
    # rl: the protocol's two ends (src/rl/engine/link.c) and the tasks
    "rl_link_listen": (i32, [cp, cp, i32, u64, i32, i32, i32, i32, _c.POINTER(vp)]),
    "rl_link_addr": (cp, [vp]),
    "rl_link_set_version": (i32, [vp, i32]),
    "rl_link_ask": (i32, [vp, i32, i32, i32]),
    "rl_link_poll": (i32, [vp, _c.c_double, vp, i32]),
    "rl_link_workers": (i32, [vp]),
    "rl_link_stop": (i32, [vp, i32, _c.c_double]),
    "rl_link_stats_json": (i32, [vp, _c.POINTER(vp)]),
    "rl_link_close": (None, [vp]),
    "rl_link_connect": (i32, [cp, cp, cp, i32, _c.POINTER(vp)]),
    "rl_link_next": (i32, [vp, _c.c_double, _c.POINTER(i64), i32]),
    "rl_link_send": (i32, [vp, vp, i32]),
    "rl_link_refuse": (i32, [vp, i32]),
    "rl_link_bye": (i32, [vp, i32, vp, sz]),
    "rl_link_image": (i32, [vp, _c.POINTER(vp), _c.POINTER(sz)]),
    "rl_alphabet": (cp, []),
    "rl_task_parse": (i32, [cp, _c.POINTER(i32)]),
    "rl_task_prompt": (i32, [i32, u64, _c.c_char_p, sz]),
    "rl_task_answer": (i32, [i32, u64, _c.c_char_p, sz]),
    "rl_task_draw": (u64, [i32, i32, _c.POINTER(u64)]),
    "rl_task_eval_ids": (i32, [i32, i32, _c.POINTER(u64)]),
    "rl_task_reward": (i32, [i32, u64, _c.POINTER(_c.c_int32), i32, _c.POINTER(_c.c_float)]),
    "rl_traj_sizeof": (sz, []),
}
for _name, (_res, _args) in _PROTOS.items():
    try:
        _f = getattr(lib, _name)
    except AttributeError:
        raise ImportError("shoal: %s has no %s: the library is older than the package; rebuild it "
                          "(make) or point SHOAL_LIB at a matching one" % (lib._name, _name)) from None
    _f.restype, _f.argtypes = _res, _args

if lib.ckpt_tensor_sizeof() != _c.sizeof(CkptTensor):
    raise ImportError("shoal: libshoal's ckpt_tensor is %d bytes but python/shoal/_lib.py mirrors "
                      "%d: the package and the library come from different versions"
                      % (lib.ckpt_tensor_sizeof(), _c.sizeof(CkptTensor)))

# The library's lines (warnings from its threads included) go to the
# `logging` logger "shoal" instead of stderr.  SHOAL_LOG still sets which
# levels the library emits (default warn); the logger's own level and
# handlers decide the rest.  Python's last-resort handler prints warnings
# to stderr when the application configured no logging, as before.
log = logging.getLogger("shoal")
_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}
_SINK_T = _c.CFUNCTYPE(None, i32, cp, vp)


def _log_line(level, line, arg):
    try:
        log.log(_LEVELS.get(level, logging.WARNING), "%s", line.decode("utf-8", "replace"))
    except Exception:  # a callback from C must not raise
        pass


_sink = _SINK_T(_log_line)  # kept alive for as long as the library may call it
lib.sh_log_set_sink(_c.cast(_sink, vp), None)
# The library's threads may outlive the interpreter's teardown, when Python
# can no longer run the callback: back to stderr before that.
atexit.register(lib.sh_log_set_sink, None, None)

# safetensors dtype names by ckpt_dtype value, and back.
DTYPE_NAMES = []
while True:
    _n = lib.ckpt_dtype_name(len(DTYPE_NAMES))
    if _n is None:
        break
    DTYPE_NAMES.append(_n.decode())
DTYPE_CODES = {n: i for i, n in enumerate(DTYPE_NAMES)}


def check(rc, what=None):
    """Raises the ShoalError for a negative return code, with shoal's message
    (read on this thread, right after the failing call)."""
    if rc < 0:
        msg = (lib.sh_errmsg() or b"").decode("utf-8", "replace")
        if not msg:
            msg = lib.sh_strerror(rc).decode()
        raise error_for(rc, msg if what is None else "%s: %s" % (what, msg))
    return rc


def fspath(p):
    """A path as bytes for C.  C strings end at the first NUL, so a path
    holding one would silently name another file: it raises instead."""
    if p is None:
        return None
    b = os.fsencode(os.fspath(p))
    if b"\0" in b:
        raise ValueError("shoal: path %r holds a NUL byte (C would read it as %r)"
                         % (os.fspath(p), b.split(b"\0")[0].decode("utf-8", "replace")))
    return b


def cstr(s, what):
    """A str as UTF-8 for C; a NUL inside raises (C would cut the string
    there and use another name)."""
    if not isinstance(s, str):
        raise TypeError("shoal: %s must be str, got %s" % (what, type(s).__name__))
    if "\0" in s:
        raise ValueError("shoal: %s %r holds a NUL character (C would read it as %r)"
                         % (what, s, s.split("\0")[0]))
    return s.encode("utf-8")


def u64(x, what):
    """A version number or count for a C uint64_t: ctypes would wrap a
    negative or too large value silently (-1 became version 2**64 - 1,
    2**64 became version 0)."""
    if isinstance(x, bool) or not isinstance(x, int):
        try:
            x = x.__index__()
        except (AttributeError, TypeError):
            raise TypeError("shoal: %s must be an int, got %r" % (what, x)) from None
    if not 0 <= x < 1 << 64:
        raise ValueError("shoal: %s %d is out of range (0 .. 2**64 - 1)" % (what, x))
    return x


def take_text(ptr):
    """Decodes and frees text the library returned."""
    try:
        return _c.string_at(ptr.value).decode("utf-8")
    finally:
        lib.sh_free(ptr)


def take_json_value(json_ptr):
    """A json_t* the library returned, as Python data (the reference is
    dropped)."""
    out = vp()
    check(lib.sh_json_take_text(json_ptr, _c.byref(out)))
    return json.loads(take_text(out))


def call_json(fn, *args):
    """Calls fn(*args, &text) and returns the parsed JSON."""
    out = vp()
    check(fn(*args, _c.byref(out)))
    return json.loads(take_text(out))
