"""shoal for Python: publish PyTorch weights as versions, follow them from
replicas, and make and apply lossless deltas.

    import shoal
    store = shoal.Store("/data/store")            # a store's run ("main")
    v = store.publish(model.state_dict())          # dict of name -> torch.Tensor
    rep = shoal.Replica("/var/replica", parents=["10.0.0.1:4000"])
    rep.wait(v, timeout=60)
    changed = rep.load_into(model)                 # copies only changed tensors

A pure-Python package over libshoal.so (ctypes); docs/python.md documents
every function.  torch is imported only by the calls that take or return
tensors.
"""
from . import delta
from .errors import NotFound, ShoalError, Timeout, Unavailable
from .replica import Lease, LoadReport, Replica
from .store import Store

__all__ = ["delta", "Store", "Replica", "Lease", "LoadReport", "ShoalError", "NotFound",
           "Timeout", "Unavailable"]
