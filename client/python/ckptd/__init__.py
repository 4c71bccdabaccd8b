"""Python client for ckptd, the checkpoint daemon.

    import ckptd, numpy as np
    c = ckptd.Client()                       # $CKPTD_ADDRESS, the daemon on this host
    c.save("run", 100, {"w": w, "b": b})     # returns once staged; reuse w and b at once
    c.wait("run", 100)                       # durable on every host
    out = c.restore("run", None)             # every tensor of the newest step
    mesh = ckptd.Mesh({"x": 2}, local_device_ids=[0])  # this trainer holds device 0 of 2
    out = c.restore("run", 100, {"w": ckptd.RestoreSpec(layout=["x", "unsharded"])},
                    mesh=mesh)                # this trainer's rows of w
    out = c.restore("run", 100, {"w": ckptd.RestoreSpec(dtype="bfloat16")})
    out.dtypes["w"]                          # "bfloat16": uint16 bit patterns in out["w"]

Errors raise ckptd.Error, which carries the gRPC status code and message. PyTorch
state_dicts: ckptd.torch (import it explicitly; docs/pytorch.md).
"""

from ckptd.client import (Client, Error, Mesh, RestoreResult, RestoreSpec, SaveResult, TensorSpec,
                          daemon_target, default_socket_path)

__version__ = "0.1.0"
__all__ = ["Client", "Error", "Mesh", "RestoreResult", "RestoreSpec", "SaveResult", "TensorSpec", "daemon_target",
           "default_socket_path", "__version__"]
