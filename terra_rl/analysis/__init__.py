"""Looking at finished runs: learning-curve plots, policy playback to GIFs, failure
diagnosis, and the standard-task results table."""
