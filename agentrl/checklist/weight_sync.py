"""The checklist's weight-sync stage: the learner's weights into a rollout backend, made in memory.

    python -m agentrl.checklist.weight_sync RESULT_JSON --shape 1.5B --device cuda --paths ipc,packed

The learner's side is a random model of the shape built on the device (never written); the
receiving side is a Ray actor placed as a rollout worker is (one GPU, from a Ray started with
:func:`agentrl.runtime.ray_start.init_local_ray`) holding a :class:`TorchBackend` over a random model
of the same shape, also built in memory. No model is written to disk (a 7B one is 15 GB), so the
stage costs the syncs and two model builds. Each path is the trainer's own code:

* ``ipc``: :func:`agentrl.weights.ipc.ipc_handles` of the learner's tensors, opened and copied
  device to device by the backend's ``load_weights_ipc`` (GPU only, the actor on the learner's GPU);
* ``packed``: :func:`~agentrl.weights.packed.pack_weights` into host buckets (``pack_s``), each put
  into Ray's object store once (``put_s``), mapped by the actor and copied into its model through
  :func:`~agentrl.weights.packed.unpack_weights` and ``load_weights`` (``load_s``).

Before each timed sync the actor's weights are scrambled; after it, a float64 sum over every weight
must equal the learner's (``same_weights``): the seconds are those of a sync that delivered. The
median over ``--repeats`` syncs after one warm-up of each path is reported, with GB/s. The result file
is rewritten as it goes (:class:`agentrl.checklist.probes.ResultFile`). Like the probes, this module imports
torch, Ray and agentrl's modules inside the functions, so that an import that fails on the GPU machine
is recorded in the result file instead of ending the stage before it writes one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback

from agentrl.checklist.probes import PROBE_ARCHITECTURE, ResultFile, one_line
from agentrl.checklist.stages import SYNC_GOAL_S, SYNC_SHAPES

PATHS = ("ipc", "packed")


def model_config(shape: str):
    """The ``transformers`` config of ``shape`` (a key of :data:`SYNC_SHAPES`)."""
    from transformers import Qwen2Config

    from agentrl.models.architectures import qwen25_config

    if shape == "probe":
        return Qwen2Config(**{k: v for k, v in PROBE_ARCHITECTURE.items() if k not in ("architectures", "model_type")})
    return qwen25_config(SYNC_SHAPES[shape])


def random_model(config, dtype, device: str, seed: int):
    """A model of ``config`` with random weights, built on ``device`` (nothing read or written)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def weights_sum(named) -> float:
    """A float64 sum over every weight (computed on their device, no copy)."""
    import torch

    return float(sum(float(torch.sum(t.detach(), dtype=torch.float64)) for _, t in named))


class Receiver:
    """The engine's side, in a Ray actor: a torch rollout backend over a random model of the shape."""

    def __init__(self, shape: str, device: str, dtype: str):
        import os

        import torch

        from agentrl.generation import TorchBackend

        self.visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.backend = TorchBackend(random_model(model_config(shape), getattr(torch, dtype), device, seed=2))

    def visible_devices(self) -> str | None:
        return self.visible

    def scramble(self) -> None:
        import torch

        with torch.no_grad():
            for p in self.backend.model.parameters():
                p.add_(1.0)

    def load_packed(self, *buckets) -> None:
        from agentrl.weights import unpack_weights

        self.backend.load_weights(unpack_weights(buckets))

    def load_ipc(self, handle_sets) -> None:
        self.backend.load_weights_ipc(handle_sets)

    def checksum(self) -> float:
        return weights_sum(self.backend.model.named_parameters(remove_duplicate=False))


def measure(result: ResultFile, args: argparse.Namespace) -> None:
    import ray
    import torch

    from agentrl.runtime.ray_start import init_local_ray, local_gpus
    from agentrl.weights import ipc_handles, pack_weights

    gpu = args.device.startswith("cuda")
    wanted = [p.strip() for p in args.paths.split(",") if p.strip()]
    if not wanted or set(wanted) - set(PATHS):
        raise SystemExit(f"--paths {args.paths!r}: name one or both of {', '.join(PATHS)}")
    paths = [p for p in PATHS if p in wanted and (gpu or p != "ipc")]
    not_measured = {} if gpu or "ipc" not in wanted else {"ipc": "not run: CUDA IPC needs a GPU (--device cuda)"}
    dtype = "bfloat16" if gpu else "float32"
    start = time.perf_counter()
    learner = random_model(model_config(args.shape), getattr(torch, dtype), args.device, seed=1)
    named = list(learner.named_parameters(remove_duplicate=False))
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    expected = weights_sum(named)
    result.set(shape=args.shape, arch=SYNC_SHAPES[args.shape], device=args.device, dtype=dtype, gb=nbytes / 1e9,
               tensors=len(named), learner_build_s=time.perf_counter() - start, not_measured=not_measured,
               gpu=torch.cuda.get_device_name() if gpu else None, paths={})
    start = time.perf_counter()
    init_local_ray(2)                   # num_gpus from CUDA (local_gpus), as the trainer's Ray is started
    actor = ray.remote(Receiver).options(num_cpus=1, num_gpus=1 if gpu else 0).remote(args.shape, args.device, dtype)
    try:
        visible = ray.get(actor.visible_devices.remote(), timeout=args.place_timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise RuntimeError(f"the engine's actor ({'one GPU' if gpu else 'CPU'}) was not placed and built within "
                           f"{args.place_timeout_s:.0f} s; Ray offers {ray.cluster_resources()}") from None
    result.set(ray_gpus=local_gpus(), receiver_ready_s=time.perf_counter() - start, receiver_visible_devices=visible)
    bucket_bytes = args.bucket_mb * 2**20
    rows: dict[str, list[dict[str, float]]] = {p: [] for p in paths}
    for repeat in range(args.repeats + 1):              # the first of each path is a warm-up
        for path in paths:
            ray.get(actor.scramble.remote())
            if path == "ipc":
                begin, kept = time.perf_counter(), []
                ray.get(actor.load_ipc.remote([ipc_handles(named, kept)]))
                row = {"total_s": time.perf_counter() - begin}
                kept.clear()
            else:
                begin = time.perf_counter()
                buckets = list(pack_weights(named, bucket_bytes))
                packed = time.perf_counter()
                refs = [ray.put(bucket) for bucket in buckets]
                put = time.perf_counter()
                ray.get(actor.load_packed.remote(*refs))
                done = time.perf_counter()
                del refs, buckets
                row = {"pack_s": packed - begin, "put_s": put - packed, "load_s": done - put, "total_s": done - begin}
            got = ray.get(actor.checksum.remote())
            if abs(got - expected) > 1e-6 * max(1.0, abs(expected)):
                raise RuntimeError(f"{path}: the engine's weights sum to {got!r} after the sync, the learner's to "
                                   f"{expected!r}: the sync did not deliver them")
            if repeat:
                rows[path].append(row)
        if repeat:
            summary = {}
            for path, timings in rows.items():
                summary[path] = {key: statistics.median(r[key] for r in timings) for key in timings[0]}
                summary[path].update(gb_per_s=nbytes / 1e9 / summary[path]["total_s"], same_weights=True,
                                     repeats=len(timings))
            fastest = min(summary, key=lambda p: summary[p]["total_s"])
            result.set(paths=summary, fastest=fastest, fastest_s=summary[fastest]["total_s"], goal_s=SYNC_GOAL_S,
                       goal_met=summary[fastest]["total_s"] <= SYNC_GOAL_S if args.shape == "7B" else None)
    ray.kill(actor)
    ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl.checklist.weight_sync", description=__doc__.split("\n")[0])
    parser.add_argument("result", help="the result JSON file (rewritten as the measurement goes)")
    parser.add_argument("--shape", default="1.5B", choices=tuple(SYNC_SHAPES),
                        help="the Qwen2.5 shape of the weights (probe: the 2-layer probe architecture)")
    parser.add_argument("--device", default="cuda", help="where the learner's and the engine's weights live")
    parser.add_argument("--paths", default=",".join(PATHS), help="ipc, packed or both (ipc needs a GPU)")
    parser.add_argument("--repeats", type=int, default=1, help="timed syncs per path after one warm-up (default 1)")
    parser.add_argument("--bucket-mb", type=int, default=512, help="packed bucket size in MiB (the trainer's: 512)")
    parser.add_argument("--place-timeout-s", type=float, default=120.0,
                        help="how long the engine's actor may take to be placed and to build its model")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.bucket_mb < 1:
        parser.error("--repeats and --bucket-mb must be >= 1")
    result = ResultFile(args.result)
    try:
        measure(result, args)
    except Exception as err:  # noqa: BLE001 - recorded, and the exit status says it failed
        traceback.print_exc()
        result.fail(one_line(err))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
