"""Process and cluster plumbing shared by every role: denormal flushing (``denormals``), starting or
joining Ray and naming a lost node (``ray_start``), the environment a child ``agentrl`` process
inherits (``child_env``) and rendezvous stores held from the moment their port is chosen
(``rendezvous``)."""
