"""Jobs: their rows (staged, read, claimed, finished, swept) and what is counted
over them. Nothing here commits: the operations own the transactions."""
