"""Batches: uploaded files, batches cut into chunk jobs (at once, or by a worker's
split), their progress and streamed results. Nothing here commits."""
