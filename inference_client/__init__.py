"""A Python client for the inference job service: jobs (submit, wait by
long-poll or events, cancel, list), sync KServe v2 inference, batches, and
webhook verification. Needs `requests`; numpy (arrays) and standardwebhooks
(verify_webhook) when those are used. Imports nothing of the service."""

from inference_client.client import Client
from inference_client.errors import ApiError, WaitTimeout, WebhookVerificationError
from inference_client.resources import (
    Batch,
    BatchResults,
    Event,
    Job,
    JobError,
    ResultRow,
    UploadedFile,
)
from inference_client.webhooks import verify_webhook

__all__ = [
    "ApiError",
    "Batch",
    "BatchResults",
    "Client",
    "Event",
    "Job",
    "JobError",
    "ResultRow",
    "UploadedFile",
    "WaitTimeout",
    "WebhookVerificationError",
    "verify_webhook",
]
