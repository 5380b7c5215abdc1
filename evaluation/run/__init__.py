"""The run path: a run specification checked from the config, the run folder, the answerers and the schedules."""
