"""BiPACE: the estimator (``estimator``), the BiGPO clustering of hidden states it runs
(``clustering``), the clustering passes compiled from ``bigpo_block.c`` and driven through ctypes
(``kernel``), and the helper that builds a C kernel on first use and loads it (``kernel_loader``).
Importing the package registers the estimator."""

from agentrl.estimators.builtin.bipace.estimator import BiPACE

__all__ = ["BiPACE"]
