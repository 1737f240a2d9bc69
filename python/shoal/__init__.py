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
__version__ = "0.1.0"  # equal to the library's SHOAL_VERSION (checked at import)

from . import delta
from ._lib import lib as _libshoal, log as _log
from .errors import NotFound, ShoalError, Timeout, Unavailable
from .replica import Lease, LoadReport, Replica
from .store import Store

if _libshoal.sh_version().decode() != __version__:
    _log.warning("the shoal package is %s but %s is %s: install them together", __version__,
                 _libshoal._name, _libshoal.sh_version().decode())

__all__ = ["__version__", "delta", "Store", "Replica", "Lease", "LoadReport", "ShoalError", "NotFound",
           "Timeout", "Unavailable"]
