"""``agentrl bench sync``: the learner-to-rollout weight sync at a Qwen2.5 shape.

A model of the named Qwen2.5 architecture (random weights, written as ``model.random_init`` writes
them) is saved to a scratch directory and loaded in ``--dtype`` by ``--workers`` real Ray rollout
workers (torch backend, on ``--device``, TextCraft env actors). The learner's side is a second random model of the same shape on
``--device``. Each repeat times two ways of moving its weights into the workers:

* ``packed`` (what the trainer does): the weights are copied straight from the device into flat
  byte buckets (:mod:`agentrl.weights.packed`), each bucket is put into Ray's object
  store once, and every worker maps it and copies it into its model
  (:meth:`RolloutWorkerGroup.load_weights`). Split into ``pack_s`` and ``load_s``.
* ``broadcast`` (``rollout.weight_sync=broadcast``): this process plays the learner's rank 0 of a
  process group of its own with the workers (gloo on CPU, NCCL on GPUs) and broadcasts device
  buckets; the workers receive them into their device and load them. NCCL refuses two members of
  one group on the same GPU ("Duplicate GPU detected"), and on a GPU the workers share the learner's
  (for ``ipc``), so there broadcast is not run and the report says why (:func:`broadcast_refusal`);
* ``ipc`` (``rollout.weight_sync=ipc``, GPU only, the workers sharing the learner's GPU): CUDA IPC
  handles of the learner's tensors, copied device to device by the workers;
* ``tensor_dict`` (the sync before the packed buckets): a ``{name: CPU tensor}`` dict put into the
  object store, and an actor holding a model of the same shape on the same device gets it and
  copies every tensor in. Ray pickles tensors in band, so the bytes are copied on the way in and
  again on the way out.

The learner's model is built where it lives, never written; the workers load theirs from a scratch
directory. ``--paths`` picks the paths (the tensor dict costs minutes at 7B). The median over
``--repeats`` (after one unreported warm-up of each) is reported, with GB/s; the paths that could
not run are listed in ``meta.not_measured`` with the reason.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

from agentrl.bench._common import cpu_name, run_report
from agentrl.config import load_config
from agentrl.models import load_tokenizer, prepare_initial_model
from agentrl.models.loading import build_random_model, load_model
from agentrl.rollout.worker_group import RolloutWorkerGroup
from agentrl.runtime.ray_start import init_local_ray
from agentrl.runtime.rendezvous import reserve_store
from agentrl.weights import (BroadcastPath, IpcPath, WeightBroadcast, broadcast_layout, device_uuid,
                             ipc_handles, pack_weights)

HELP = "learner-to-rollout weight sync (packed buckets, broadcast, CUDA IPC, a tensor dict) at a Qwen2.5 shape"
PATHS = ("packed", "broadcast", "ipc", "tensor_dict")


def add_arguments(parser) -> None:
    parser.add_argument("--arch", default="Qwen/Qwen2.5-0.5B-Instruct",
                        help="a Qwen2.5 architecture (hub name) or a model directory whose config is used; "
                             "random weights either way, nothing downloaded")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32", "float16"))
    parser.add_argument("--device", default="cpu", help="where the learner's weights and the workers' models live")
    parser.add_argument("--workers", type=int, default=1, help="Ray rollout workers (default 1)")
    parser.add_argument("--repeats", type=int, default=3, help="timed syncs of each kind (default 3)")
    parser.add_argument("--bucket-mb", type=int, default=512, help="packed bucket size in MiB (default 512)")
    parser.add_argument("--paths", default=",".join(PATHS),
                        help=f"the sync paths to time, comma-separated (default {','.join(PATHS)}); one that cannot "
                             "run here (ipc off a GPU, broadcast with two members on one GPU) is reported as not "
                             "measured, with the reason")


class _DictReceiver:
    """The previous sync's receiving end: a model that copies in a ``{name: tensor}`` dict."""

    def __init__(self, model_dir: str, device: str, dtype: str):
        import torch

        self.model = load_model(model_dir, getattr(torch, dtype)).to(device)

    def load(self, state_dict) -> None:
        own = self.model.state_dict()
        for name, value in state_dict.items():
            own[name].copy_(value.to(own[name].device, own[name].dtype))


def _random_model(cfg, arch: str, directory: str, seed: int) -> str:
    """A random model of ``arch`` written to ``directory`` the way ``model.random_init`` writes one."""
    cfg.model.name_or_path, cfg.model.random_init = arch, True
    corpus = ["craft 1 stick using 2 planks", "get 1 oak log", "inventory"]   # when arch has no tokenizer here
    return prepare_initial_model(cfg.model, cfg.tokenizer, directory, corpus=lambda: corpus, seed=seed)


def broadcast_refusal(device: str, learner_gpu: str | None, worker_gpus: list[str | None]) -> str | None:
    """Why the broadcast path cannot run with the learner on ``learner_gpu`` and the workers on
    ``worker_gpus`` (device UUIDs), or None when it can. On CPU it is a gloo group: always fine. On GPUs
    it is an NCCL group, and NCCL refuses two members on one GPU ("Duplicate GPU detected"): this bench
    puts the workers on the learner's GPU (what CUDA IPC needs), so on one GPU broadcast is refused."""
    if not str(device).startswith("cuda"):
        return None
    members = [learner_gpu, *worker_gpus]
    if len(set(members)) == len(members):
        return None
    return (f"not run: NCCL refuses two members of one group on the same GPU (\"Duplicate GPU detected\"), and the "
            f"learner and {len(worker_gpus)} worker(s) share {len(set(members))} GPU(s) here; broadcast needs a GPU "
            "per member (agentrl train with placement.layout=split on more GPUs)")


def requested_paths(text: str, gpu: bool) -> tuple[list[str], dict[str, str]]:
    """The paths ``--paths`` names, in the order they are timed, and those that cannot run here with why."""
    wanted = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in PATHS]
    if unknown or not wanted:
        raise SystemExit(f"--paths {text!r}: name one or more of {', '.join(PATHS)}")
    skipped = {} if gpu or "ipc" not in wanted else {"ipc": "not run: CUDA IPC needs a GPU (--device cuda)"}
    return [p for p in PATHS if p in wanted and p not in skipped], skipped


def _measure(args) -> dict:
    import ray
    import torch

    if args.workers < 1 or args.repeats < 1 or args.bucket_mb < 1:
        raise SystemExit("--workers, --repeats and --bucket-mb must be >= 1")
    dtype = getattr(torch, args.dtype)
    gpu = args.device.startswith("cuda")
    paths, skipped = requested_paths(args.paths, gpu)
    cfg = load_config("textcraft_grpo_tiny", [f"env.tasks_per_iteration={args.workers}", "env.group_size=1",
                                              "env.num_servers=1"])
    receiver = sender = None
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-sync-") as scratch:
        model_dir = _random_model(cfg, args.arch, os.path.join(scratch, "model"), seed=0)
        # the learner's side: another random model of the shape, built where it lives (not written)
        source = build_random_model(args.arch, len(load_tokenizer(model_dir)), seed=1,
                                    device=args.device).to(dtype)
        named = list(source.named_parameters(remove_duplicate=False))
        nbytes = sum(p.numel() * p.element_size() for _, p in named)
        if not ray.is_initialized():
            init_local_ray(max(2, args.workers + 2))
        share = 1.0 / (args.workers + 1) if gpu else 0.0
        group = RolloutWorkerGroup(model_dir, cfg.rollout, cfg.env, num_workers=args.workers, backend="torch",
                                   device=args.device, dtype=args.dtype, worker_num_cpus=0.5, env_num_cpus=0.5,
                                   num_gpus_per_worker=share)
        try:
            if "broadcast" in paths:
                why = broadcast_refusal(args.device, device_uuid() if gpu else None, group.gpu_uuids())
                if why:
                    paths.remove("broadcast")
                    skipped["broadcast"] = why
            if "tensor_dict" in paths:
                receiver = ray.remote(_DictReceiver).options(num_cpus=0.5, num_gpus=share).remote(
                    model_dir, args.device, args.dtype)
            if "broadcast" in paths:
                port = reserve_store(args.workers + 1)
                joining = group.weights_call_each(BroadcastPath.Receiver, "join", [
                    ("127.0.0.1", port, i + 1, args.workers + 1) for i in range(args.workers)])
                sender = WeightBroadcast("127.0.0.1", port, 0, args.workers + 1, "cuda" if gpu else "cpu")
                group.wait(joining)
            times = _time_paths(paths, group, named, sender, receiver, args)
        finally:
            group.close()
            if receiver is not None:
                ray.kill(receiver)
    results = {}
    for kind, rows in times.items():
        results[kind] = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        results[kind]["gb_per_s"] = nbytes / 1e9 / results[kind]["total_s"]
    if "tensor_dict" in results:
        for kind in results:
            if kind != "tensor_dict":
                results[kind]["speedup"] = results["tensor_dict"]["total_s"] / results[kind]["total_s"]
    meta = {"cpu": cpu_name(), "cores": os.cpu_count(), "device": args.device,
            "gpu": torch.cuda.get_device_name() if gpu else None, "arch": args.arch, "dtype": args.dtype,
            "gb": nbytes / 1e9, "tensors": len(named), "workers": args.workers, "repeats": args.repeats,
            "bucket_mb": args.bucket_mb, "not_measured": skipped}
    return {"meta": meta, "results": results}


def _time_paths(paths: list[str], group, named, sender, receiver, args) -> dict[str, list[dict[str, float]]]:
    """Each path's timings over ``args.repeats`` syncs, after one unreported warm-up of each."""
    import ray

    bucket_bytes = args.bucket_mb * 2**20
    layout = broadcast_layout(named, bucket_bytes) if "broadcast" in paths else None
    times: dict[str, list[dict[str, float]]] = {kind: [] for kind in paths}
    for repeat in range(args.repeats + 1):
        rows = {}
        if "broadcast" in paths:
            start = time.perf_counter()
            receiving = group.weights_call(BroadcastPath.Receiver, "receive", layout)
            sender.send(iter(named), layout)
            group.wait(receiving)
            rows["broadcast"] = {"total_s": time.perf_counter() - start}
        if "ipc" in paths:
            start, kept = time.perf_counter(), []
            # one set: the learner is one rank
            group.wait(group.weights_call(IpcPath.Receiver, "load", [ipc_handles(named, kept)]))
            kept.clear()
            rows["ipc"] = {"total_s": time.perf_counter() - start}
        if "packed" in paths:
            start = time.perf_counter()
            buckets = list(pack_weights(named, bucket_bytes))
            packed = time.perf_counter()
            group.load_weights(buckets)
            done = time.perf_counter()
            del buckets
            rows["packed"] = {"pack_s": packed - start, "load_s": done - packed, "total_s": done - start}
        if "tensor_dict" in paths:
            start = time.perf_counter()
            ray.get(receiver.load.remote(ray.put({k: v.detach().to("cpu") for k, v in named})))
            rows["tensor_dict"] = {"total_s": time.perf_counter() - start}
        if repeat:   # the first of each is a warm-up
            for kind, row in rows.items():
                times[kind].append(row)
    return {kind: times[kind] for kind in ("packed", "broadcast", "ipc", "tensor_dict") if kind in times}


def run(args) -> int:
    return run_report(args, _measure, _show)


def _show(meta: dict, rows: dict) -> None:
    where = meta["gpu"] or f"{meta['cpu']}, {meta['cores']} cores"
    print(f"weight sync benchmark: {meta['arch']} shape, {meta['gb']:.2f} GB of {meta['dtype']} in {meta['tensors']} "
          f"tensors, {meta['workers']} worker(s) on {meta['device']} ({where}); median of {meta['repeats']}")
    print(f"{'path':<13}{'pack s':>8}{'load s':>8}{'total s':>9}{'GB/s':>7}{'speed-up':>10}")
    for name, row in rows.items():
        pack = f"{row['pack_s']:.2f}" if "pack_s" in row else "-"
        load = f"{row['load_s']:.2f}" if "load_s" in row else "-"
        speedup = f"{row['speedup']:.2f}x" if "speedup" in row else "-"
        print(f"{name:<13}{pack:>8}{load:>8}{row['total_s']:>9.2f}{row['gb_per_s']:>7.2f}{speedup:>10}")
    for name, why in meta.get("not_measured", {}).items():
        print(f"{name}: {why}")
