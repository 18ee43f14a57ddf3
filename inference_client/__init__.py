"""A Python client for the inference job service, by resource as
replicate-python arranges it: `client.jobs` (submit, wait by long-poll or
events, cancel, list), `client.infer` (sync KServe v2), `client.batches` and
`client.files` (files, arrays, pandas DataFrames and Parquet; progress bars
with tqdm), `client.generations` (a chat model's text, streamed, structured or
as label scores), `client.embeddings`, `client.models`, and webhook
verification. Needs `requests`, numpy and tqdm; pandas and pyarrow (the
`parquet` extra) for DataFrames, standardwebhooks (`webhooks`) for
verify_webhook. Imports nothing of the service."""

from inference_client.batches import Batches
from inference_client.client import Client
from inference_client.embeddings import Embeddings
from inference_client.errors import ApiError, JobFailed, WaitTimeout, WebhookVerificationError
from inference_client.files import Files
from inference_client.generations import Generations
from inference_client.jobs import Jobs
from inference_client.models import Models
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
__version__ = "0.2.0"

__all__ = [
    "ApiError",
    "Batch",
    "BatchResults",
    "Batches",
    "Client",
    "Embeddings",
    "Event",
    "Files",
    "Generations",
    "Job",
    "JobError",
    "JobFailed",
    "Jobs",
    "Models",
    "ResultRow",
    "UploadedFile",
    "WaitTimeout",
    "WebhookVerificationError",
    "__version__",
    "verify_webhook",
]
