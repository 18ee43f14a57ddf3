"""Jobs: their rows (staged, read, claimed, finished, swept), the one runner every
door's jobs reach, wake-ups for the workers and sync calls' reply channel.
Nothing here commits: the operations own the transactions."""
