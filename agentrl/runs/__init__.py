"""What a run is made of besides its components: the run directory with its checkpoints and resume
(``directory``), its metrics trackers and phase timers (``tracking``) and which tasks each iteration
plays (``task_schedule``)."""
