"""Celery side: the Celery app, thin tasks, the beat schedule."""
