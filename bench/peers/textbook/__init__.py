"""The textbook design: Flask + SQLAlchemy + one Celery task per job, a commit per
state change. What most tutorials build, kept small on purpose; the bar the
service must clear three times over."""
