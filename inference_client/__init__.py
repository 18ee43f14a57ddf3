"""A Python client for the inference job service: jobs (submit, wait by
long-poll or events, cancel, list), sync KServe v2 inference, batches (files,
arrays, pandas DataFrames and Parquet; progress bars with tqdm), and webhook
verification. Needs `requests`, numpy and tqdm; pandas and pyarrow (the
`parquet` extra) for DataFrames, standardwebhooks (`webhooks`) for
verify_webhook. Imports nothing of the service."""

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

# The one place the version is kept: the package's build reads it from here too.
__version__ = "0.1.0"

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
    "__version__",
    "verify_webhook",
]
