"""The warm start: the policy a run starts RL from.

The steps, in order, each in its module:

* :mod:`~agentrl.warmstart.demonstrations`: the environments' expert solvers play training tasks,
  rendered with the rollout's own prompt builder into (prompt, response) pairs (also the text a
  tiny model's tokenizer is trained on);
* :mod:`~agentrl.warmstart.sft`: supervised fine-tuning on those demonstrations;
* :mod:`~agentrl.warmstart.dagger`: DAgger, in which the policy plays training tasks greedily and the
  env's expert labels every state it reaches; SFT's DAgger rounds train on those examples too;
* :mod:`~agentrl.warmstart.starting_policy`: the choice of the starting policy
  (``trainer.init_checkpoint``, a tiny model warm-started here, or a named checkpoint);
* :mod:`~agentrl.warmstart.cache`: finished warm starts reused across runs (``trainer.sft.cache_dir``);
* :mod:`~agentrl.warmstart.process_pool`: the spawned worker processes that play the demonstrations
  and the DAgger episodes;

The settings of the techniques added to plain SFT (DAgger, recovery variants, class balance) are
declared in :mod:`agentrl.config.sft_options`, from which the config generates
``trainer.sft.<technique>``.

This package sits above :mod:`agentrl.rollout`, :mod:`agentrl.envs` and :mod:`agentrl.models` (it
uses their prompts, environments and models); none of those, nor :mod:`agentrl.data`,
:mod:`agentrl.learner` or :mod:`agentrl.estimators`, imports it. The trainer and the CLI do.
"""
