"""Packing weights into flat byte buckets for the rollout workers (agentrl.weights.packed)."""

import pickle

import numpy as np
import pytest
import torch

from agentrl.weights import as_buckets, pack_weights, unpack_weights
from agentrl.weights.base import ALIGN


def mixed_weights():
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(50, 8, generator=g).to(torch.bfloat16),
        "layer.q.weight": torch.randn(8, 8, generator=g),
        "layer.q.weight_t": torch.randn(8, 6, generator=g).t(),   # not contiguous
        "norm.eps": torch.tensor(1e-6, dtype=torch.float64),        # 0-dim
        "steps": torch.arange(5, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "half": torch.randn(3, 3, generator=g).half(),
    }


def test_buckets_round_trip_every_dtype_shape_and_order():
    state = mixed_weights()
    buckets = list(pack_weights(state.items(), bucket_bytes=512))
    assert len(buckets) > 1
    for bucket in buckets:   # a bucket goes over the size only when one tensor alone is larger
        assert bucket.buffer.dtype == np.uint8
        assert bucket.buffer.nbytes <= 512 or len(bucket.entries) == 1
        assert bucket.buffer.nbytes >= bucket.entries[-1][3] + bucket.entries[-1][4]
        assert all(offset % ALIGN == 0 for _, _, _, offset, _ in bucket.entries)
    out = unpack_weights(buckets)
    assert list(out) == list(state)
    for name, tensor in state.items():
        assert out[name].dtype == tensor.dtype and out[name].shape == tensor.shape, name
        assert torch.equal(out[name], tensor), name


def test_buckets_survive_pickling_out_of_band_as_ray_sends_them():
    state = mixed_weights()
    buffers = []
    wire = [pickle.dumps(b, protocol=5, buffer_callback=buffers.append) for b in pack_weights(state.items())]
    assert len(buffers) == len(wire)           # each bucket's bytes travel outside the pickle
    received = []
    for data, buf in zip(wire, buffers):
        raw = buf.raw()
        view = memoryview(bytes(raw))           # read-only, like a mapped object-store buffer
        received.append(pickle.loads(data, buffers=[view]))
    assert all(not b.buffer.flags.writeable for b in received)
    out = unpack_weights(received)
    for name, tensor in state.items():
        assert torch.equal(out[name], tensor), name


def test_a_state_dict_is_packed_and_buckets_pass_through():
    state = mixed_weights()
    packed = list(as_buckets(state))
    assert list(as_buckets(packed)) == packed
    with pytest.raises(ValueError, match="more than one bucket"):
        unpack_weights(packed + packed)
    with pytest.raises(ValueError, match="bucket_bytes"):
        list(pack_weights(state.items(), bucket_bytes=0))


def test_weights_written_for_the_ranks_read_back_bit_for_bit(tmp_path):
    """The shared file through which a tensor-parallel vLLM engine's ranks take host weights."""
    from agentrl.generation.vllm.ranks import read_shared_file, write_shared_file


    state = {"a": torch.randn(3, 5), "b": torch.arange(7, dtype=torch.int64), "c": torch.randn(2, 2).bfloat16().t()}
    path, entries = write_shared_file(state, directory=str(tmp_path))
    read = dict(read_shared_file(path, entries))
    assert list(read) == ["a", "b", "c"]
    assert all(torch.equal(read[k], v) and read[k].dtype == v.dtype for k, v in state.items())
    assert all(offset % 64 == 0 for _, _, _, offset, _ in entries)


def test_each_engine_rank_opens_the_handles_on_its_own_gpu():
    """rollout.weight_sync=ipc with several learner ranks: one set of handles per learner GPU; an engine
    rank takes its own GPU's set, else one on a GPU it sees, else a one-line error naming the fix."""
    from agentrl.weights import IpcWeights, pick_handle_set

    sets = [IpcWeights("GPU-0"), IpcWeights("GPU-1")]
    assert pick_handle_set(sets, "GPU-1", ["GPU-0", "GPU-1"]) is sets[1]
    assert pick_handle_set(sets, "GPU-2", ["GPU-2", "GPU-0"]) is sets[0]
    with pytest.raises(ValueError, match="rollout.weight_sync=packed"):
        pick_handle_set(sets, "GPU-5", ["GPU-5"])
