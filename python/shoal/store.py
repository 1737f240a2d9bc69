"""A store's run: versioned weights on a file system (docs/store-format.md)."""
import ctypes
import json
import os

from . import _lib
from ._lib import check, fspath, lib

# The safetensors __metadata__ key under which publish records tied tensors:
# a JSON object {alias name: stored name} (docs/safetensors.md).
ALIASES_KEY = "shoal.aliases"


class Store:
    """Run `run` of the store at `root` (created when `create`).

        store = shoal.Store("/data/store")
        v = store.publish({"w": torch.zeros(4, 4, dtype=torch.bfloat16)})

    A Store is a handle; close() (or a `with` block) frees it.  Its first
    publish makes it the run's only publisher until it is closed: another
    Store (in any process) that publishes to the run meanwhile raises
    ShoalError (EEXIST) naming this one's pid, which catches every DDP rank
    publishing.  Publishers that share a run on purpose each pass a
    `writer_id`; they exclude only publishers that give none.

    A Store that publishes tensors keeps the image of the version it
    published last in memory (`keep_previous`, default on: up to two copies
    of the model, the kept one and the one being published) and encodes the
    next delta against it with `threads` threads (0: all cores), so that a
    publish neither writes a checkpoint file for a delta version nor reads
    the previous version back.  The kept image is used only while the run's
    LATEST names it (checked at every publish); after a restart or another
    writer's version it is read back from the store once.
    """

    def __init__(self, root, run=None, create=True, anchor_every=0, writer_id=None, async_depth=2,
                 keep_previous=True, threads=0):
        self.root = os.fspath(root)
        self._async = None
        self._async_depth = int(async_depth)
        if self._async_depth < 1:
            raise ValueError("shoal.Store: async_depth %d: use 1 or more" % self._async_depth)
        self.writer_id = writer_id
        self._claimed = False
        wid = _lib.cstr(writer_id, "writer_id") if writer_id is not None else None
        self.anchor_every = _lib.u64(anchor_every, "anchor_every")
        h = ctypes.c_void_p()
        check(lib.store_open(fspath(root), _lib.cstr(run, "run id") if run else None, 1 if create else 0,
                             ctypes.byref(h)))
        self._h = h
        self._wid = wid
        if keep_previous:
            threads = int(threads)
            try:
                check(lib.store_publish_keep(h, 1, threads))
            except BaseException:
                lib.store_close(h)
                self._h = None
                raise
        self.run = run or "main"

    def close(self):
        """Waits for the publishes publish_async queued, frees the handle,
        and raises the first background error not yet raised."""
        try:
            if getattr(self, "_async", None) is not None:
                self._async.drain()
                self._async.shutdown()
        finally:
            if getattr(self, "_h", None):
                lib.store_close(self._h)
                self._h = None
        a, self._async = self._async, None
        if a is not None:
            a.raise_error()

    def __del__(self):
        # Never waits: queued publishes hold a reference to this Store, so
        # none is left once it is collected (and waiting for a thread from
        # a collection, which may run anywhere, can deadlock).
        a = getattr(self, "_async", None)
        if a is not None:
            a.shutdown(wait=False)
        if getattr(self, "_h", None):
            lib.store_close(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _handle(self):
        if not self._h:
            raise ValueError("shoal.Store: used after close()")
        return self._h

    def _claim(self):
        if not self._claimed:
            check(lib.store_claim_publisher(self._handle(), self._wid))
            self._claimed = True

    def publish_async(self, state_dict):
        """Publishes a dict of name -> torch.Tensor as the next version in
        the background and returns a concurrent.futures.Future of its
        number.  It returns once the tensors are copied into a snapshot
        (buffers reused from call to call, pinned for CUDA tensors), so the
        caller may change them right away (optimizer.step()).  Versions are
        published in call order, one at a time, on a background thread;
        at most `async_depth` snapshots exist (a call waits for a free one).
        An error in the background is raised by the next publish_async,
        publish, flush or close (once), and by its Future."""
        if not hasattr(state_dict, "items"):
            raise TypeError("shoal.Store.publish_async: takes a dict of name -> torch.Tensor, got %s "
                            "(publish files with publish())" % type(state_dict).__name__)
        if self._async is None:
            from ._async import Publisher
            self._async = Publisher(self._async_depth)
        self._async.raise_error()
        self._claim()
        self._handle()
        return self._async.submit(self._publish_now, state_dict)

    def flush(self):
        """Waits until every publish_async call so far is published, raises
        the first background error not yet raised, and returns the version
        LATEST names."""
        if self._async is not None:
            self._async.drain()
            self._async.raise_error()
        return self.latest()

    def publish(self, x):
        """Publishes x as the next version and returns its number.  x is a
        .safetensors file, a sharded folder (with
        model.safetensors.index.json), or a dict of name -> torch.Tensor
        (contiguous CPU tensors, written straight from their memory;
        tensors that are the same memory, such as tied weights, are stored
        once and recorded as aliases, which replicas restore).  The
        store keeps a delta against the previous version, or a full anchor
        every `anchor_every` versions (default 8)."""
        if self._async is not None:  # after the queued ones, in order
            self._async.drain()
            self._async.raise_error()
        self._claim()
        return self._publish_now(x)

    def _publish_now(self, x):
        out = ctypes.c_uint64()
        if isinstance(x, dict) or hasattr(x, "items") and not isinstance(x, (str, bytes, os.PathLike)):
            from . import _torch
            items, aliases = _torch.dedup(list(x.items()))
            arr = (_lib.CkptTensor * max(len(items), 1))()
            keep = []
            for i, (name, t) in enumerate(items):
                arr[i] = _torch.spec_of(name, t, _lib.DTYPE_CODES, _lib.CkptTensor)
                keep.append(t)  # the tensors stay alive through the call
            meta = json.dumps({ALIASES_KEY: json.dumps(aliases, sort_keys=True)}).encode() if aliases else None
            check(lib.store_publish_tensors_meta(self._handle(), arr, len(items), meta, self.anchor_every,
                                                 ctypes.byref(out)))
            del keep
        else:
            check(lib.store_publish_path(self._handle(), fspath(x), self.anchor_every,
                                         ctypes.byref(out)))
        return out.value

    def latest(self):
        """The version LATEST names, or 0 when the run has none."""
        v = ctypes.c_uint64()
        check(lib.store_latest(self._handle(), ctypes.byref(v)))
        return v.value

    def versions(self):
        """Every version's manifest, oldest first: a list of dicts with
        "version", "kind" ("anchor" or "delta"), "base", "size" (payload
        bytes), "xxh3", "model_size", "model_xxh3", "created_at"; a version
        whose manifest cannot be read is {"version": v, "broken": True}."""
        return _lib.call_json(lib.store_list_json, self._handle())

    def materialize(self, version, out):
        """Writes version `version`'s full checkpoint to the file `out`
        (atomically, checked against its manifest).  Returns `out`."""
        check(lib.store_materialize(self._handle(), _lib.u64(version, "version"), 0, None, fspath(out)))
        return out
