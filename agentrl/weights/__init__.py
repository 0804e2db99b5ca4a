"""Moving policy weights from the learner to the rollout workers: one module per weight path.

* :mod:`~agentrl.weights.packed` (``packed``): flat byte buckets through host memory and Ray's object
  store (every layout; the only one on CPU);
* :mod:`~agentrl.weights.ipc` (``ipc``): CUDA IPC handles of the learner's tensors, copied device to
  device by the engine rank on the same GPU (ZeRO <= 2, colocated, between rollouts only);
* :mod:`~agentrl.weights.broadcast` (``broadcast``): a process group of the learner's rank 0 and
  the workers (NCCL on GPUs, gloo on CPU), received straight into each worker's device memory,
  during a rollout too.

:mod:`~agentrl.weights.base` says what a path is (a sender in the learner ranks, a receiver in the
rollout workers, the path itself in the trainer's process) and holds the registry
(:data:`WEIGHT_PATHS`; ``rollout.weight_sync`` picks one, ``auto`` by the layout). The trainer's
weight-sync component (:mod:`agentrl.training.weight_sync`) builds the path for a run.
"""

from agentrl.weights.base import (BUCKET_BYTES, WEIGHT_PATHS, SyncLayout, WeightPath, choose_path, device_uuid)
from agentrl.weights.broadcast import BroadcastLayout, BroadcastPath, WeightBroadcast, broadcast_layout
from agentrl.weights.ipc import IpcPath, IpcWeights, ipc_handles, local_device_index, open_ipc_handles, pick_handle_set
from agentrl.weights.packed import PackedPath, PackedWeights, as_buckets, load_packed, pack_weights, unpack_weights

__all__ = ["BUCKET_BYTES", "BroadcastLayout", "BroadcastPath", "IpcPath", "IpcWeights", "PackedPath", "PackedWeights",
           "SyncLayout", "WEIGHT_PATHS", "WeightBroadcast", "WeightPath", "as_buckets", "broadcast_layout",
           "choose_path", "device_uuid", "ipc_handles", "load_packed", "local_device_index", "open_ipc_handles",
           "pack_weights", "pick_handle_set", "unpack_weights"]
