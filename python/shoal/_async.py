"""Store.publish_async: a snapshot on the caller's thread, the publish
(encoding, fsync, LATEST) on one background thread, in order.

The snapshot copies every tensor into buffers this object keeps and reuses
(pinned host memory for CUDA tensors), so the caller may change its tensors
(optimizer.step()) as soon as publish_async returns.  `depth` snapshot sets
exist: a call waits while all of them are still being published, which
bounds memory to `depth` copies of the model.  An error in the background
is raised by the next publish_async, publish or flush (once), and by the
Future of the publish that failed."""
import collections
import threading
from concurrent.futures import ThreadPoolExecutor

from .errors import ShoalError


class Publisher:
    def __init__(self, depth):
        if depth < 1:
            raise ValueError("shoal.Store: async depth %d: use 1 or more" % depth)
        self._free = collections.deque({} for _ in range(depth))
        self._cv = threading.Condition()
        self._error = None
        self._exec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shoal-publish")

    def raise_error(self):
        """Raises the first background error not yet raised."""
        with self._cv:
            e, self._error = self._error, None
        if e is not None:
            raise e

    def submit(self, publish, state):
        """Snapshots `state` and queues publish(snapshot); returns the
        Future of its version number."""
        from . import _torch
        items, aliases = _torch.dedup(list(state.items()))
        with self._cv:
            while not self._free:
                self._cv.wait()
            bufs = self._free.popleft()
        try:
            snap, event = _torch.snapshot(items, bufs)
        except BaseException:
            self._give_back(bufs)
            raise
        for alias, name in aliases.items():
            snap[alias] = snap[name]  # still one tensor: stored once
        fut = self._exec.submit(self._run, publish, snap, bufs, event)
        fut.add_done_callback(self._done)
        return fut

    def _run(self, publish, snap, bufs, event):
        try:
            if event is not None:
                event.synchronize()  # the device-to-host copies are complete
            return publish(snap)
        finally:
            self._give_back(bufs)

    def _give_back(self, bufs):
        with self._cv:
            self._free.append(bufs)
            self._cv.notify_all()

    def _done(self, fut):
        e = fut.exception()
        if e is not None:
            if isinstance(e, ShoalError):
                e.args = ("background publish: " + str(e),)
            with self._cv:
                if self._error is None:
                    self._error = e

    def drain(self):
        """Waits for every queued publish (the executor runs them in
        order, so a no-op queued now finishes last)."""
        self._exec.submit(lambda: None).result()

    def shutdown(self, wait=True):
        self._exec.shutdown(wait=wait)
