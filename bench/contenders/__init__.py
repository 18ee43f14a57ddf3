"""How the bench starts, drives and stops each contender.

Redis database numbers: the service gets REDIS_URL as given (database 0 of the
embedded server); the Celery no-op uses 14 and the textbook design 15, emptied
before use.
"""
