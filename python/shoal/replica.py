"""Replicas: a directory kept on the newest version of a run, fed by a store
(polling LATEST) or a push tree (attached to parents), with the active
version's tensors leased as zero-copy torch views."""
import ctypes
import json
import os

from . import _lib
from ._lib import check, fspath, lib
from .errors import ShoalError, error_for
from .store import ALIASES_KEY


class _ReplicaHandle:
    """Owns the C replica; freed when the Replica and every lease are gone."""

    def __init__(self, cfg):
        h = ctypes.c_void_p()
        check(lib.store_replica_open_json(json.dumps(cfg).encode(), ctypes.byref(h)))
        self.h = h

    def __del__(self):
        if getattr(self, "h", None):
            lib.store_replica_close_json(self.h)
            self.h = None


class _LeaseHandle:
    """Owns one C lease (which pins its version's mapped image); released
    when the Lease object and every tensor view over it are gone."""

    def __init__(self, rep, min_version, exact_version):
        p = ctypes.POINTER(_lib.StoreLease)()
        check(lib.store_lease_new(rep.h, _lib.u64(min_version, "min_version"),
                                  _lib.u64(exact_version, "exact_version"), ctypes.byref(p)))
        self.rep, self.p = rep, p
        self.version = p.contents.version
        self.ckpt = p.contents.ckpt

    def __del__(self):
        if getattr(self, "p", None):
            lib.store_lease_free(self.rep.h, self.p)
            self.p = None


class Lease:
    """The active version of a replica, pinned: its image stays mapped and
    unchanged until release() and until every tensor view from tensors() is
    gone, even when the replica activates newer versions meanwhile."""

    def __init__(self, handle):
        self._lh = handle
        self.version = handle.version

    def tensors(self):
        """The version's tensors as a dict name -> read-only torch.Tensor
        views over the mapped image (no copy), in file order, then the
        aliases publish recorded (tied weights), each the very tensor object
        of the name it aliases."""
        from . import _torch
        lh = self._lh
        if lh is None:
            raise ValueError("shoal.Lease: used after release()")
        out = {}
        for i in range(lib.ckpt_count(lh.ckpt)):
            t = lib.ckpt_tensor_at(lh.ckpt, i).contents
            shape = tuple(t.shape[d] for d in range(t.ndim))
            out[t.name.decode("utf-8")] = _torch.view(t.data or 0, t.nbytes, _lib.DTYPE_NAMES[t.dtype],
                                                      shape, lh)
        for alias, name in self._aliases(out).items():
            out[alias] = out[name]
        return out

    def _aliases(self, stored):
        """{alias: stored name} from the version's metadata, checked: a
        replica does not trust what a version's header says."""
        raw = lib.ckpt_meta(self._lh.ckpt, ALIASES_KEY.encode())
        if raw is None:
            return {}
        try:
            a = json.loads(raw.decode("utf-8"))
        except ValueError as e:
            a = e
        if not isinstance(a, dict):
            raise ShoalError(-4, "version %d: metadata %s is not a JSON object of names (%s)"
                             % (self.version, ALIASES_KEY, a))
        for alias, name in a.items():
            if not isinstance(name, str) or name not in stored or alias in stored:
                raise ShoalError(-4, "version %d: metadata %s: %r -> %r: an alias must name a stored "
                                 "tensor and not be one" % (self.version, ALIASES_KEY, alias, name))
        return a

    def _dtype_names(self):
        """name -> the version's safetensors dtype name (aliases included)."""
        lh = self._lh
        out = {}
        for i in range(lib.ckpt_count(lh.ckpt)):
            t = lib.ckpt_tensor_at(lh.ckpt, i).contents
            out[t.name.decode("utf-8")] = _lib.DTYPE_NAMES[t.dtype]
        for alias, name in self._aliases(out).items():
            out[alias] = out[name]
        return out

    def release(self):
        """Drops this object's hold; the version is unpinned once no tensor
        view from it remains."""
        self._lh = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class LoadReport:
    """What load_into() did: `version` loaded, `changed` (names copied, in
    file order), `unchanged` (names already bit-identical), `bytes_copied`."""

    def __init__(self, version):
        self.version = version
        self.changed, self.unchanged = [], []
        self.bytes_copied = 0

    def __repr__(self):
        return "LoadReport(version=%d, changed=%d tensors (%d bytes), unchanged=%d)" % (
            self.version, len(self.changed), self.bytes_copied, len(self.unchanged))


class Replica:
    """A replica in directory `dir`, following either the store at `store`
    (polling its LATEST every `poll_s` seconds) or a push tree through
    `parents` ("host:port" of a `shoal push serve` root, relay or another
    replica).  Keyword options are those of `shoal replica`: run, zone,
    fanout, leaf, egress_bps.  It starts following at once, in background
    threads, and restores the version DIR held when it was last closed.

        rep = shoal.Replica("/var/rep", parents=["127.0.0.1:4000"])
        v = rep.wait(1, timeout=60)
    """

    def __init__(self, dir, store=None, parents=None, run=None, zone=None, fanout=0, leaf=False,
                 egress_bps=0.0, poll_s=0.0):
        cfg = {"dir": os.fsdecode(fspath(dir))}
        if store is not None:
            cfg["store"] = os.fsdecode(fspath(store))
        if parents:
            if isinstance(parents, str):
                parents = [parents]
            cfg["parents"] = [str(p) for p in parents]
        for k, v in (("run", run), ("zone", zone)):
            if v is not None:
                _lib.cstr(v, k)
                cfg[k] = v
        cfg.update(fanout=int(fanout), leaf=bool(leaf), egress_bps=float(egress_bps),
                   poll_s=float(poll_s))
        self.dir = cfg["dir"]
        self._rh = _ReplicaHandle(cfg)

    def _h(self):
        if self._rh is None:
            raise ValueError("shoal.Replica: used after close()")
        return self._rh

    def close(self):
        """Stops following.  The replica's threads end once no lease or
        tensor view of it remains."""
        self._rh = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def version(self):
        """The active version (0: none yet)."""
        return lib.store_replica_version(self._h().h)

    def wait(self, min_version, timeout=60.0):
        """Blocks until a version >= min_version is active (its activation
        complete and durable) and returns the active version.  Raises
        shoal.Timeout after `timeout` seconds."""
        check(lib.store_replica_wait(self._h().h, _lib.u64(min_version, "min_version"), float(timeout)))
        return self.version

    def info(self):
        """The replica's state: {"version", "newest_announced",
        "activated_at", "pause_max_ms", "activations", "failures",
        "last_error", "bytes_received", "bytes_sent", "chunks_corrupt",
        "reattaches", "redirects", "children_refused", "children",
        "attached", "parent_error"}.  "newest_announced" is the newest
        version the replica knows exists (its push parent announced it, or
        the store's LATEST): wait(info()["newest_announced"]) waits for the
        newest, where wait(1) returns whatever is active first."""
        return _lib.call_json(lib.store_replica_info_json, self._h().h)

    def lease(self, min_version=0, exact_version=0):
        """Pins the active version (see Lease).  Raises shoal.Unavailable
        when it is older than min_version, is not exact_version, or there is
        none yet."""
        return Lease(_LeaseHandle(self._h(), min_version, exact_version))

    def tensors(self, min_version=0):
        """The active version's tensors: a dict name -> read-only torch view
        over the mapped image (zero-copy).  The version stays pinned while
        any of the views lives."""
        return self.lease(min_version).tensors()

    def load_into(self, target, strict=True, min_version=0):
        """Brings `target` (a torch.nn.Module or a dict name -> tensor) to the
        active version in place: a tensor is copied only when its bits
        differ from the version's (converted to the target's dtype when that
        differs).  Returns a LoadReport naming what changed.  With strict,
        names present on one side only are an error, as in
        Module.load_state_dict; shapes must always match."""
        import torch
        from . import _torch
        with self.lease(min_version) as lease:
            src = lease.tensors()
            kinds = lease._dtype_names()
            rep = LoadReport(lease.version)
            lh = lease._lh  # held by the views in src until this returns
        dst = target.state_dict() if isinstance(target, torch.nn.Module) else target
        extra = [n for n in src if n not in dst]
        missing = [n for n in dst if n not in src]
        if strict and (extra or missing):
            raise error_for(-6, "load version %d: %s%s%s" % (
                rep.version, "not in the target: %s" % _names(extra) if extra else "",
                "; " if extra and missing else "",
                "not in the version: %s" % _names(missing) if missing else ""))
        # Every tensor is checked before any is written, so that a load that
        # raises leaves the target as it was (not half on the new version).
        pairs = [(n, s, dst[n]) for n, s in src.items() if n in dst]
        for name, s, d in pairs:
            if tuple(d.shape) != tuple(s.shape):
                raise ShoalError(-1, "load version %d: tensor %s: shape %s in the version, %s in the "
                                 "target; nothing was loaded" % (rep.version, name, tuple(s.shape),
                                                                 tuple(d.shape)))
            # Types torch 1.13 lacks are viewed as an integer type of the
            # same width holding their bits (U16 as int16, F8_E4M3 as
            # uint8): converting those to another dtype would turn bits into
            # numbers, so only a bit copy is allowed.
            if kinds[name] not in _torch.TO_NAME.values() and d.dtype != s.dtype:
                raise ShoalError(-1, "load version %d: tensor %s: %s in the version has no torch "
                                 "dtype (its bits are viewed as %s), the target is %s; load it into "
                                 "a %s tensor; nothing was loaded" % (rep.version, name, kinds[name],
                                                                      s.dtype, d.dtype, s.dtype))
        with torch.no_grad():
            pages = _PageDropper(lh)
            for name, s, d in pairs:
                if _load_one(s, d, pages):
                    rep.changed.append(name)
                    rep.bytes_copied += d.numel() * d.element_size()
                else:
                    rep.unchanged.append(name)
            pages.flush()
        return rep


# load_into reads the leased image in slices of this many bytes, and lets
# the pages it read leave the process every _DROP_BYTES: a follower then
# holds its own tensors and not also the leased image (issue 31, item 1).
_SLICE_BYTES = 2 << 20
_DROP_BYTES = 4 << 20


class _PageDropper:
    """Drops the leased image's pages (store_lease_drop_pages: its clean,
    file-backed mapping; they stay in the page cache) once load_into has
    read them, a window of _DROP_BYTES at a time."""

    def __init__(self, lh):
        self.lh, self.base, self.size = lh, lh.p.contents.data or 0, lh.p.contents.size
        self.lo = self.hi = None

    def read(self, t):
        off = t.data_ptr() - self.base
        n = t.numel() * t.element_size()
        if n == 0 or off < 0 or off + n > self.size:
            return
        self.lo = off if self.lo is None else min(self.lo, off)
        self.hi = off + n if self.hi is None else max(self.hi, off + n)
        if self.hi - self.lo >= _DROP_BYTES:
            self.flush()

    def flush(self):
        if self.lo is not None:
            check(lib.store_lease_drop_pages(self.lh.p, self.lo, self.hi - self.lo))
        self.lo = self.hi = None


def _load_one(s, d, pages):
    """Brings target tensor d to the bits of leased tensor s (converted
    when the dtype or device differs), a slice at a time so that the pages
    read can go; whether anything was copied."""
    same = s.dtype == d.dtype and d.device.type == "cpu"
    n = s.numel()
    step = max(1, _SLICE_BYTES // max(1, s.element_size()))
    if n <= step or not d.is_contiguous():
        s2 = s if same else s.to(device=d.device, dtype=d.dtype)
        differ = not _same_bits(d, s2)
        if differ:
            d.copy_(s2)
        pages.read(s)
        return differ
    sf, df, differ = s.reshape(-1), d.view(-1), False
    for i in range(0, n, step):
        a, b = sf[i:i + step], df[i:i + step]
        a2 = a if same else a.to(device=d.device, dtype=d.dtype)
        if not _same_bits(b, a2):
            b.copy_(a2)
            differ = True
        pages.read(a)
    return differ


def _names(names, k=5):
    more = " and %d more" % (len(names) - k) if len(names) > k else ""
    return ", ".join(names[:k]) + more


def _same_bits(a, b):
    """Whether two tensors of one dtype and shape hold the same bits (NaN
    payloads and signed zeros included, which torch.equal would not see)."""
    import torch
    ints = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
            torch.float64: torch.int64, torch.complex64: torch.int64}
    it = ints.get(a.dtype)
    if it is not None and a.is_contiguous() and b.is_contiguous():
        return torch.equal(a.view(it), b.view(it))
    return torch.equal(a, b)
