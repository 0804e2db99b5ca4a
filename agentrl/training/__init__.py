"""The training loop (``trainer``) and the components it composes: where each iteration's groups
come from (``sources``), how new weights reach the rollout (``weight_sync``), and what happens when
a rollout or an actor fails (``failures``)."""
