"""Moving policy weights between processes, for the learner (sender) and the rollout workers
(receivers): flat byte buckets through host memory, CUDA IPC handles on one GPU and a broadcast
process group across devices (``transfer``). Which of them a run uses, and when, is the trainer's
weight-sync component (:mod:`agentrl.training.weight_sync`)."""

from agentrl.weights.transfer import (BUCKET_BYTES, BroadcastLayout, IpcWeights, PackedWeights, WeightBroadcast,
                                      as_buckets, broadcast_layout, device_uuid, ipc_handles, local_device_index,
                                      open_ipc_handles, pack_weights, unpack_weights)

__all__ = ["BUCKET_BYTES", "BroadcastLayout", "IpcWeights", "PackedWeights", "WeightBroadcast", "as_buckets",
           "broadcast_layout", "device_uuid", "ipc_handles", "local_device_index", "open_ipc_handles", "pack_weights",
           "unpack_weights"]
