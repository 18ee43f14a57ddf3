"""Beat schedules: cron runs of batches, stored in PostgreSQL."""
