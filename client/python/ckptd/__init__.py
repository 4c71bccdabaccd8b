"""Python client for ckptd, the checkpoint daemon.

    import ckptd, numpy as np
    c = ckptd.Client()                       # $CKPTD_ADDRESS, the daemon on this host
    c.save("run", 100, {"w": w, "b": b})     # returns once staged; reuse w and b at once
    c.wait("run", 100)                       # durable on every host
    out = c.restore("run", None, {"w": (w.shape, w.dtype, None)})  # newest step

Errors raise ckptd.Error, which carries the gRPC status code and message.
"""

from ckptd.client import Client, Error, SaveResult, RestoreResult

__all__ = ["Client", "Error", "SaveResult", "RestoreResult"]
