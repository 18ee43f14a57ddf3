"""Tenants: their API keys (stored hashed, cached per process) and their quotas,
counted over their jobs, batches and files. Nothing here commits."""
