"""Evaluation, sweeps and the papers' tables.

* :mod:`~agentrl.evaluation.episodes`  the append-only episode log of ``agentrl eval`` and its summary
* :mod:`~agentrl.evaluation.runner`    ``agentrl eval``: a checkpoint on a whole split with the rollout workers
* :mod:`~agentrl.evaluation.sweep`     ``agentrl sweep``: a grid of training runs with a resumable manifest
* :mod:`~agentrl.evaluation.results`   per-run numbers collected from a results directory
* :mod:`~agentrl.evaluation.tables`    the tables (Markdown, LaTeX, CSV) with published reference rows
* :mod:`~agentrl.evaluation.plots`     learning curves (PNG)
* :mod:`~agentrl.evaluation.stats`     mean, std and Student-t intervals

Modules import their heavy dependencies (Ray, torch, matplotlib) inside the functions that need them.
"""
