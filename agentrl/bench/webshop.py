"""``agentrl bench webshop``: WebShop at scale: index build, cached load, search, steps, memory.

On a catalogue in the original files' format (``--data-dir``; without it the generated catalogue
of ``--num-products`` products, default the original's 1,181,436, is written once under the cache
root), each phase runs in a fresh Python process so that times and peak memory are its own:

``build``   load with an empty cache: stream the files, normalise, index, write the cache (wall
            time, peak RSS); skipped when the cache exists unless ``--rebuild``;
``load``    load from the cache (memory-mapped), then in the same process: search latency over
            ``--queries`` goal instructions and as many two-word queries (p50/p99 of the
            engine's top 50, and with the 50 products decoded), env steps/s of one instance for
            the expert and the random-walk policy of ``agentrl bench webshop-steps`` on
            distinct tasks (resets timed), with the per-process cache of the last 1,024 rankings
            (the default; the expert's planning search and its episode's search are one query,
            the random walk's two-word queries repeat often) and without it (``_uncached``: every
            search runs the engine), and the memory of
            ``--instances`` instances sharing the one loaded copy (RSS growth per instance after
            each reset and one search), with the process's RSS (the
            memory-mapped cache is page cache shared by processes: RSS is split into private
            ``RssAnon`` and mapped-file ``RssFile``).

The environment's package (``agentrl_env_webshop``, a distribution of its own that a learner's install may
not have) and the servers are imported inside the functions that use them, so that ``agentrl bench``
lists this benchmark wherever agentrl is installed.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from typing import Any

HELP = "WebShop at scale: index build time and peak memory, cached load, search p50/p99, steps/s"


def add_arguments(parser) -> None:
    parser.add_argument("--data-dir", default=None,
                        help="directory with the original files (default: the generated catalogue)")
    parser.add_argument("--num-products", type=int, default=None,
                        help="generated catalogue size (default 1,181,436) or the first N of --data-dir")
    parser.add_argument("--cache-dir", default=None,
                        help="index cache root (default $AGENTRL_CACHE_DIR/webshop)")
    parser.add_argument("--rebuild", action="store_true", help="delete the cache and build it again")
    parser.add_argument("--queries", type=int, default=500, help="queries of each kind (default 500)")
    parser.add_argument("--seconds", type=float, default=10.0, help="time per policy (default 10)")
    parser.add_argument("--instances", type=int, default=64,
                        help="env instances sharing one copy (default 64)")


def _status_mb(field: str = "VmRSS") -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _rss_mb() -> float:
    return _status_mb("VmRSS")


def _peak_rss_mb() -> float:
    # VmHWM, not getrusage: ru_maxrss survives exec and would include the parent's peak
    return _status_mb("VmHWM")


def _kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"index_cache": spec["cache_dir"]}
    if spec["data_dir"] is not None:
        kwargs["data_dir"] = spec["data_dir"]
    if spec["num_products"] is not None:
        kwargs["num_products"] = spec["num_products"]
    return kwargs


def _phase_generate(spec: dict[str, Any]) -> dict[str, Any]:
    from agentrl_env_webshop.dataset import generated_catalogue_dir
    start = time.perf_counter()
    directory = generated_catalogue_dir(spec["num_products"], 0, spec["cache_dir"])
    size = sum(p.stat().st_size for p in directory.iterdir())
    return {"dir": str(directory), "seconds": time.perf_counter() - start,
            "bytes": size, "peak_rss_mb": _peak_rss_mb()}


def _phase_build(spec: dict[str, Any]) -> dict[str, Any]:
    from agentrl_env_webshop.dataset import load_webshop_data
    start = time.perf_counter()
    data = load_webshop_data(**_kwargs(spec))
    seconds = time.perf_counter() - start
    with open(os.path.join(data.cache_dir, "meta.json")) as f:
        meta = json.load(f)
    size = sum(e.stat().st_size for e in os.scandir(data.cache_dir))
    return {"seconds": seconds, "peak_rss_mb": _peak_rss_mb(), "cache_dir": data.cache_dir,
            "cache_bytes": size, **meta}


def _percentiles(samples: list[float]) -> dict[str, float]:
    import numpy as np
    ms = np.asarray(samples) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean()), "n": len(samples)}


def _phase_load(spec: dict[str, Any]) -> dict[str, Any]:
    from agentrl.bench.webshop_steps import play_expert, play_random_walk
    from agentrl.envs import TaskRef, make_env
    from agentrl_env_webshop import dataset
    from agentrl_env_webshop.dataset import load_webshop_data

    base_rss = _rss_mb()
    start = time.perf_counter()
    data = load_webshop_data(**_kwargs(spec))
    load_seconds = time.perf_counter() - start
    report: dict[str, Any] = {"load_seconds": load_seconds, "cache_dir": data.cache_dir,
                              "rss_after_load_mb": _rss_mb(), "python_rss_mb": base_rss,
                              "products": len(data.products)}
    rng = random.Random(0)
    goals = data.splits["train"] + data.splits["eval"]
    instructions = [g["instruction_text"].lower() for g in goals[:spec["queries"]]]
    short = [f"{rng.choice(g['instruction_text'].split())} {rng.choice(['red', 'large'])}"
             for g in goals[:spec["queries"]]]
    for name, queries in (("instruction", instructions), ("two-word", short)):
        times, decoded = [], []
        for query in queries:  # uncached: the engine, then the 50 products decoded
            t = time.perf_counter()
            ranking = data.search_engine.search(query)
            t1 = time.perf_counter()
            [data.products[i] for i in ranking]
            times.append(t1 - t)
            decoded.append(time.perf_counter() - t)
        report[f"search_{name}"] = _percentiles(times)
        report[f"search_decoded_{name}"] = _percentiles(decoded)
    env = make_env("webshop", **_kwargs(spec))
    split = "train"
    size = env.split_sizes()[split]
    task = 0
    runs = [("expert", play_expert, True), ("random", play_random_walk, True),
            ("expert_uncached", play_expert, False), ("random_uncached", play_random_walk, False)]
    for name, policy, ranking_cache in runs:
        if not ranking_cache:  # every search runs the engine
            dataset.RANKINGS_KEPT = 0
            env.data.clear_rankings()
        steps = episodes = 0
        start = time.perf_counter()
        while time.perf_counter() - start < spec["seconds"]:
            steps += policy(env, TaskRef(split, task % size), rng)
            task += 1
            episodes += 1
        seconds = time.perf_counter() - start
        report[f"steps_{name}"] = {"episodes": episodes, "steps": steps, "seconds": seconds,
                                   "steps_per_s": steps / seconds}
    import tracemalloc
    before = _rss_mb()
    tracemalloc.start()
    envs = [make_env("webshop", **_kwargs(spec)) for _ in range(spec["instances"])]
    for i, instance in enumerate(envs):
        _, info = instance.reset(TaskRef(split, (task + i) % size))
        instance.step(f"search[{info['task']}]")
    traced = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    after = _rss_mb()
    report["instances"] = {
        "n": len(envs), "share_one_copy": all(e.data is env.data for e in envs),
        "rss_growth_mb": after - before, "per_instance_kb": (after - before) * 1024 / len(envs),
        "python_alloc_per_instance_kb": traced / 1024 / len(envs)}
    report["rss_end_mb"] = _rss_mb()
    report["rss_anon_end_mb"] = _status_mb("RssAnon")  # private to the process
    report["rss_file_end_mb"] = _status_mb("RssFile")  # mapped cache pages, shared by processes
    report["peak_rss_mb"] = _peak_rss_mb()
    return report


def _run_phase(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "agentrl.bench.webshop", name, json.dumps(spec)],
                         check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(args) -> dict[str, Any]:
    from agentrl.bench._common import cpu_name
    from agentrl_env_webshop.catalogue import FULL_NUM_PRODUCTS
    from agentrl_env_webshop.dataset import default_cache_root

    spec = {"data_dir": args.data_dir, "num_products": args.num_products,
            "cache_dir": args.cache_dir or str(default_cache_root()), "queries": args.queries,
            "seconds": args.seconds, "instances": args.instances}
    results: dict[str, Any] = {}
    if spec["data_dir"] is None:
        spec["num_products"] = spec["num_products"] or FULL_NUM_PRODUCTS
        results["generate"] = _run_phase("generate", spec)
        spec["data_dir"], spec["num_products"] = results["generate"]["dir"], None
    cache_dir = _run_phase("locate", spec)["cache_dir"]
    if args.rebuild:
        shutil.rmtree(cache_dir, ignore_errors=True)
    existed = os.path.isdir(cache_dir)
    results["build"] = {**_run_phase("build", spec), "built": not existed}
    results["load"] = _run_phase("load", spec)
    meta = {"cpu": cpu_name(), "cores": os.cpu_count(), "loadavg": os.getloadavg(),
            "data_dir": spec["data_dir"]}
    return {"meta": meta, "results": results}


def _phase_locate(spec: dict[str, Any]) -> dict[str, Any]:
    from pathlib import Path

    from agentrl_env_webshop import products as prod
    from agentrl_env_webshop.dataset import cache_key
    paths = prod.original_file_paths(spec["data_dir"])
    root = Path(spec["cache_dir"])
    return {"cache_dir": str(root / f"index-{cache_key(root, paths, spec['num_products'], 0, True)}")}


def show(meta: dict[str, Any], results: dict[str, Any]) -> None:
    load = ", ".join(f"{x:.2f}" for x in meta["loadavg"])
    print(f"{meta['cpu']}, {meta['cores']} cores, load average {load} (at the end)")
    if "generate" in results:
        g = results["generate"]
        print(f"catalogue files: {g['dir']} ({g['bytes'] / 1e9:.2f} GB), {g['seconds']:.1f} s")
    b, lo = results["build"], results["load"]
    verb = "build" if b["built"] else "open (cache existed; --rebuild to time the build)"
    print(f"{verb}: {b['seconds']:.1f} s, peak RSS {b['peak_rss_mb'] / 1024:.2f} GiB, "
          f"{b['num_products']:,} products, {b['postings']:,} postings, vocabulary {b['vocab']:,}, "
          f"goals {b['num_goals']}, cache {b['cache_bytes'] / 1e9:.2f} GB")
    print(f"cached load: {lo['load_seconds']:.2f} s, RSS {lo['rss_after_load_mb']:.0f} MiB "
          f"(Python with the env imported: {lo['python_rss_mb']:.0f} MiB)")
    for name in ("instruction", "two-word"):
        s = lo[f"search_{name}"]
        d = lo[f"search_decoded_{name}"]
        print(f"search ({name} queries, n={s['n']}): p50 {s['p50_ms']:.1f} ms, "
              f"p99 {s['p99_ms']:.1f} ms, mean {s['mean_ms']:.1f} ms; with the 50 products "
              f"decoded p50 {d['p50_ms']:.1f} ms, p99 {d['p99_ms']:.1f} ms")
    for name in ("expert", "random", "expert_uncached", "random_uncached"):
        s = lo[f"steps_{name}"]
        print(f"steps ({name}): {s['steps']} steps in {s['episodes']} episodes, "
              f"{s['steps_per_s']:,.0f} steps/s")
    i = lo["instances"]
    print(f"{i['n']} instances (one shared copy: {i['share_one_copy']}): RSS growth "
          f"{i['per_instance_kb']:.0f} KiB each, Python allocations "
          f"{i['python_alloc_per_instance_kb']:.0f} KiB each (decoded products included)")
    print(f"process at the end: RSS {lo['rss_end_mb']:.0f} MiB = {lo['rss_anon_end_mb']:.0f} MiB "
          f"private + {lo['rss_file_end_mb']:.0f} MiB mapped files (page cache, shared by "
          f"processes), peak {lo['peak_rss_mb']:.0f} MiB")


def run(args) -> int:
    from agentrl.bench._common import run_report
    return run_report(args, measure, show)


_PHASES = {"generate": _phase_generate, "build": _phase_build, "load": _phase_load,
           "locate": _phase_locate}

if __name__ == "__main__":
    print(json.dumps(_PHASES[sys.argv[1]](json.loads(sys.argv[2]))))
