"""Stream bindings: a tenant's model bound to an input log and an output log,
stored in PostgreSQL, and the record of each input entry that became a job."""
