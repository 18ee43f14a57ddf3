"""Execution: what runs claimed jobs (the runner, the one way a card runs on a
micro-batch), the leases kept while they run, and the wake-ups that bring a
model's workers to its queue. Job state (rows, claims, transitions) is app.jobs'."""
