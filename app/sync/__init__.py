"""The sync transport: calls handed to the workers over Redis (the lane), their
answers straight back to the waiting process (replies), their records journaled
and written behind (records), and a caller's calls followed to their answers
(calls). It reads and writes Redis; of PostgreSQL only the call records' inserts
and the reads of calls that became jobs."""
