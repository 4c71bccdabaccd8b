"""A client of ckptd.v1 as an outside team writes one, generated from the proto as
it stood when the compatibility rule was written (tests/compat/golden/, never edited):
save, wait, list and a streamed restore against the current daemon. It follows the
rule the proto states: it acts on the stream messages it knows and skips the others.

  golden_client.py SOCKET_PATH STUB_DIR   (stubs generated there by the test)
"""

import sys

import grpc
import numpy as np

sys.path.insert(0, sys.argv[2])
from ckptd.v1 import ckptd_pb2, ckptd_pb2_grpc  # noqa: E402  (the golden stubs)

DT_FLOAT, DT_INT64 = 1, 9


def main():
    channel = grpc.insecure_channel("unix:" + sys.argv[1])
    stub = ckptd_pb2_grpc.CkptdStub(channel)
    weights = np.arange(3 * 1000, dtype=np.float32).reshape(3, 1000)
    counter = np.array([2 ** 62 + 7], dtype=np.int64)
    header = ckptd_pb2.SaveHeader(run="golden", step=5, trainer_id=0, trainer_count=1, tensors=[
        ckptd_pb2.TensorDescriptor(name="w", dtype=DT_FLOAT, shape=[3, 1000]),
        ckptd_pb2.TensorDescriptor(name="n", dtype=DT_INT64, shape=[1])])
    payload = weights.tobytes() + counter.tobytes()
    requests = [ckptd_pb2.SaveRequest(header=header)]
    requests += [ckptd_pb2.SaveRequest(data=payload[i:i + 5000]) for i in range(0, len(payload), 5000)]
    stub.Save(iter(requests), timeout=60)
    stub.Wait(ckptd_pb2.StepRef(run="golden", step=5), timeout=120)

    listed = stub.ListCheckpoints(ckptd_pb2.ListCheckpointsRequest(run="golden"), timeout=30)
    assert [c.step for c in listed.checkpoints] == [5], listed
    tensors = stub.ListTensors(ckptd_pb2.ListTensorsRequest(run="golden", latest=True), timeout=30)
    assert sorted(t.name for t in tensors.tensors) == ["n", "w"], tensors

    wanted = [ckptd_pb2.TensorRequest(name="w"), ckptd_pb2.TensorRequest(name="n")]
    got = {0: bytearray(weights.nbytes), 1: bytearray(counter.nbytes)}
    seen_header = False
    for message in stub.Restore(ckptd_pb2.RestoreRequest(run="golden", latest=True, tensors=wanted),
                                timeout=60):
        kind = message.WhichOneof("payload")
        if kind == "header":
            seen_header = True
        elif kind == "chunk":
            c = message.chunk
            got[c.tensor_index][c.offset:c.offset + len(c.data)] = c.data
        # Any other message (one this proto knows, or a newer one it does not): skipped.
    assert seen_header
    assert bytes(got[0]) == weights.tobytes() and bytes(got[1]) == counter.tobytes()
    print("golden client: save, wait, list, list tensors and restore work against this daemon")


if __name__ == "__main__":
    main()
