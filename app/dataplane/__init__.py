"""The operations every door calls (`DataPlane`) and the typed requests they take."""

from app.dataplane.plane import DataPlane
from app.dataplane.requests import (
    BatchRequest,
    InferRequest,
    JobQuery,
    JobRequest,
    ScheduleFields,
    ScheduleInput,
    Wait,
    Webhook,
)

__all__ = [
    "BatchRequest",
    "DataPlane",
    "InferRequest",
    "JobQuery",
    "JobRequest",
    "ScheduleFields",
    "ScheduleInput",
    "Wait",
    "Webhook",
]
