"""Running a training job: the trainer (compiled init, update and eval), the host loop,
checkpoints, the run directory, the metrics logger, warm starts and multi-process start-up."""
