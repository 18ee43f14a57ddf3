"""The batch door: uploaded files, batches cut into chunk jobs, results streamed."""
