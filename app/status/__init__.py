"""What the status page shows: queue depths, throughput, dead letters and the
workers online, read with a few bounded queries and cached per process."""
