"""``agentrl bench sync``: the learner-to-rollout weight sync at a Qwen2.5 shape.

A model of the named Qwen2.5 architecture (random weights, written as ``model.random_init`` writes
them) is saved to a scratch directory and loaded in ``--dtype`` by ``--workers`` real Ray rollout
workers (torch backend, on ``--device``, TextCraft env actors). The learner's side is a second random model of the same shape on
``--device``. Each repeat times two ways of moving its weights into the workers:

* ``packed`` (what the trainer does): the weights are copied straight from the device into flat
  byte buckets (:mod:`agentrl.weights.transfer`), each bucket is put into Ray's object
  store once, and every worker maps it and copies it into its model
  (:meth:`RolloutWorkerGroup.load_weights`). Split into ``pack_s`` and ``load_s``.
* ``broadcast`` (``rollout.weight_sync=broadcast``): this process plays the learner's rank 0 of a
  process group of its own with the workers (gloo on CPU, NCCL on GPUs) and broadcasts device
  buckets; the workers receive them into their device and load them;
* ``ipc`` (``rollout.weight_sync=ipc``, GPU only, the workers sharing the learner's GPU): CUDA IPC
  handles of the learner's tensors, copied device to device by the workers;
* ``tensor_dict`` (the sync before the packed buckets): a ``{name: CPU tensor}`` dict put into the
  object store, and an actor holding a model of the same shape on the same device gets it and
  copies every tensor in. Ray pickles tensors in band, so the bytes are copied on the way in and
  again on the way out.

The median over ``--repeats`` (after one unreported warm-up of each) is reported, with GB/s.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

from agentrl.bench._common import cpu_name, run_report

HELP = "learner-to-rollout weight sync (packed buckets, broadcast, CUDA IPC, a tensor dict) at a Qwen2.5 shape"


def add_arguments(parser) -> None:
    parser.add_argument("--arch", default="Qwen/Qwen2.5-0.5B-Instruct",
                        help="a Qwen2.5 architecture (hub name) or a model directory whose config is used; "
                             "random weights either way, nothing downloaded")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32", "float16"))
    parser.add_argument("--device", default="cpu", help="where the learner's weights and the workers' models live")
    parser.add_argument("--workers", type=int, default=1, help="Ray rollout workers (default 1)")
    parser.add_argument("--repeats", type=int, default=3, help="timed syncs of each kind (default 3)")
    parser.add_argument("--bucket-mb", type=int, default=512, help="packed bucket size in MiB (default 512)")


class _DictReceiver:
    """The previous sync's receiving end: a model that copies in a ``{name: tensor}`` dict."""

    def __init__(self, model_dir: str, device: str, dtype: str):
        import torch

        from agentrl.models.loading import load_model

        self.model = load_model(model_dir, getattr(torch, dtype)).to(device)

    def load(self, state_dict) -> None:
        own = self.model.state_dict()
        for name, value in state_dict.items():
            own[name].copy_(value.to(own[name].device, own[name].dtype))


def _random_model(cfg, arch: str, directory: str, seed: int) -> str:
    """A random model of ``arch`` written to ``directory`` the way ``model.random_init`` writes one."""
    from agentrl.models import prepare_initial_model

    cfg.model.name_or_path, cfg.model.random_init = arch, True
    corpus = ["craft 1 stick using 2 planks", "get 1 oak log", "inventory"]   # when arch has no tokenizer here
    return prepare_initial_model(cfg.model, cfg.tokenizer, directory, corpus=lambda: corpus, seed=seed)


def _measure(args) -> dict:
    import ray
    import torch

    from agentrl.config import load_config
    from agentrl.models import load_model
    from agentrl.runtime.ray_start import init_local_ray
    from agentrl.runtime.rendezvous import reserve_store
    from agentrl.weights.transfer import WeightBroadcast, broadcast_layout, ipc_handles, pack_weights
    from agentrl.rollout.workers import RolloutWorkerGroup

    if args.workers < 1 or args.repeats < 1 or args.bucket_mb < 1:
        raise SystemExit("--workers, --repeats and --bucket-mb must be >= 1")
    dtype = getattr(torch, args.dtype)
    gpu = args.device.startswith("cuda")
    cfg = load_config("textcraft_grpo_tiny", [f"env.tasks_per_iteration={args.workers}", "env.group_size=1",
                                              "env.num_servers=1"])
    times: dict[str, list[dict[str, float]]] = {"packed": [], "broadcast": [], "tensor_dict": []}
    if gpu:
        times["ipc"] = []
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-sync-") as scratch:
        model_dir = _random_model(cfg, args.arch, os.path.join(scratch, "model"), seed=0)
        source = load_model(_random_model(cfg, args.arch, os.path.join(scratch, "source"), seed=1),
                            dtype).to(args.device)
        named = list(source.named_parameters(remove_duplicate=False))
        nbytes = sum(p.numel() * p.element_size() for _, p in named)
        if not ray.is_initialized():
            init_local_ray(max(2, args.workers + 2))
        share = 1.0 / (args.workers + 1) if gpu else 0.0
        group = RolloutWorkerGroup(model_dir, cfg.rollout, cfg.env, num_workers=args.workers, backend="torch",
                                   device=args.device, dtype=args.dtype, worker_num_cpus=0.5, env_num_cpus=0.5,
                                   num_gpus_per_worker=share)
        receiver = ray.remote(_DictReceiver).options(num_cpus=0.5, num_gpus=share).remote(model_dir, args.device,
                                                                                          args.dtype)
        port = reserve_store(args.workers + 1)
        joining = group.join_weight_broadcast("127.0.0.1", port)
        sender = WeightBroadcast("127.0.0.1", port, 0, args.workers + 1, "cuda" if gpu else "cpu")
        group.wait(joining)
        layout = broadcast_layout(named, args.bucket_mb * 2**20)
        try:
            for repeat in range(args.repeats + 1):
                start = time.perf_counter()
                receiving = group.receive_weights(layout)
                sender.send(iter(named), layout)
                group.wait(receiving)
                broadcast_row = {"total_s": time.perf_counter() - start}
                ipc_row = None
                if gpu:
                    start, kept = time.perf_counter(), []
                    group.load_weights_ipc(ipc_handles(named, kept))
                    kept.clear()
                    ipc_row = {"total_s": time.perf_counter() - start}
                start = time.perf_counter()
                buckets = list(pack_weights(named, args.bucket_mb * 2**20))
                packed = time.perf_counter()
                group.load_weights(buckets)
                done = time.perf_counter()
                del buckets
                row = {"pack_s": packed - start, "load_s": done - packed, "total_s": done - start}
                start = time.perf_counter()
                ray.get(receiver.load.remote(ray.put({k: v.detach().to("cpu") for k, v in named})))
                dict_row = {"total_s": time.perf_counter() - start}
                if repeat:   # the first of each is a warm-up
                    times["packed"].append(row)
                    times["broadcast"].append(broadcast_row)
                    times["tensor_dict"].append(dict_row)
                    if ipc_row is not None:
                        times["ipc"].append(ipc_row)
        finally:
            group.close()
            ray.kill(receiver)
    results = {}
    for kind, rows in times.items():
        results[kind] = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        results[kind]["gb_per_s"] = nbytes / 1e9 / results[kind]["total_s"]
    for kind in results:
        if kind != "tensor_dict":
            results[kind]["speedup"] = results["tensor_dict"]["total_s"] / results[kind]["total_s"]
    meta = {"cpu": cpu_name(), "cores": os.cpu_count(), "device": args.device,
            "gpu": torch.cuda.get_device_name() if gpu else None, "arch": args.arch, "dtype": args.dtype,
            "gb": nbytes / 1e9, "tensors": len(named), "workers": args.workers, "repeats": args.repeats,
            "bucket_mb": args.bucket_mb}
    return {"meta": meta, "results": results}


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
