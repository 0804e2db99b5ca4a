"""The built-in estimators: every module or subpackage here is one estimator, registered with
:func:`~agentrl.estimators.registry.register_estimator` when it is imported. The registry imports
each of them on first use, so adding an estimator is adding one module (or one subpackage whose
``__init__`` imports the estimator) here, with nothing to list elsewhere. The interface and the
shared pieces they build on live one level up, in :mod:`agentrl.estimators`."""
