"""`Client`: the service's HTTP API from Python, over `requests`, by resource as
replicate-python arranges it: `client.models`, `client.jobs`, `client.files`,
`client.batches`, `client.generations`, `client.embeddings`; the sync KServe v2
call is `client.infer`.

Calls that wait (long-polls, event streams, following a batch) ride out what a
waiting client meets: 429 and 503 (no sooner than their Retry-After), 502 and
504 from a proxy, and dropped connections, with exponential backoff and jitter;
an event stream resumes after the last event it received (Last-Event-ID), so
nothing is missed or repeated. Every other call makes one request: any answer
outside 2xx raises `ApiError`, a network failure raises `requests`' own error.
"""

from __future__ import annotations

import os
from typing import Any

import requests

from inference_client import tensors
from inference_client.batches import Batches
from inference_client.embeddings import Embeddings
from inference_client.errors import ApiError
from inference_client.files import Files
from inference_client.generations import Generations
from inference_client.jobs import Jobs
from inference_client.models import Models, model_path, named_inputs

__all__ = ["Client"]

# The service's address and a tenant's key, when `Client()` is not given them.
URL_VARIABLE, KEY_VARIABLE = "INFERENCE_URL", "INFERENCE_API_KEY"
DEFAULT_URL = "http://127.0.0.1:8000"


class Client:
    """One service, one API key. Not meant to be shared between threads (its
    `requests.Session` keeps connections open for the next call)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        session: requests.Session | None = None,
        max_backoff: float = 30.0,
    ) -> None:
        """`base_url` and `api_key` default to $INFERENCE_URL (else
        http://127.0.0.1:8000) and $INFERENCE_API_KEY, so code and the shell name
        them once; arguments given win. `timeout` bounds each request's connect
        and each read (a waiting call adds its own wait to it); `max_backoff` caps
        one pause between retries."""
        if base_url is None:
            base_url = os.environ.get(URL_VARIABLE) or DEFAULT_URL
        if api_key is None:
            api_key = os.environ.get(KEY_VARIABLE) or None
        if not api_key:
            raise ValueError(f"no API key: pass api_key or set {KEY_VARIABLE}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_backoff = max_backoff
        self.session = session or requests.Session()
        self._headers = {"Authorization": f"Bearer {api_key}", "User-Agent": "inference-client/1"}
        self.models = Models(self)
        self.jobs = Jobs(self)
        self.files = Files(self)
        self.batches = Batches(self)
        self.generations = Generations(self)
        self.embeddings = Embeddings(self)

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- HTTP ------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        timeout: float | tuple[float, float] | None = None,
        stream: bool = False,
        **kwargs: Any,
    ) -> requests.Response:
        headers = {**self._headers, **kwargs.pop("headers", {})}
        response = self.session.request(
            method, self.base_url + path, headers=headers, stream=stream,
            timeout=timeout if timeout is not None else self.timeout, **kwargs,
        )  # fmt: skip
        if not 200 <= response.status_code < 300:
            error = ApiError.from_response(response)
            response.close()
            raise error
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self._request(method, path, **kwargs)
        body = response.json()
        if not isinstance(body, dict):
            raise ApiError(response.status_code, title="Unexpected answer",
                           detail="the body is not a JSON object", body=response.text)  # fmt: skip
        return body

    # -- sync inference --------------------------------------------------------

    def infer(
        self,
        model: str,
        inputs: Any,
        *,
        version: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """POST /v2/models/<model>/infer (KServe v2 JSON): the outputs by name, as
        numpy arrays of their datatypes (nested lists without numpy). `inputs` as
        for `jobs.submit`; datatypes come from the model's metadata. `timeout`
        (seconds): the service's deadline for the call, past which it answers
        504 `sync-timeout` with the job's id (`ApiError.problem["job_id"]`)."""
        if tensors.is_v2_tensors(inputs):
            body_inputs = [tensors.v2_tensor(tensor) for tensor in inputs]
        else:
            metadata = self.models.get(model, version)
            specs = {spec["name"]: spec for spec in metadata.get("inputs", [])}
            body_inputs = []
            for name, value in named_inputs(self.models, model, version, inputs).items():
                datatype = specs.get(name, {}).get("datatype") or tensors.datatype_of(value)
                if datatype is None:
                    raise ValueError(f"model {model} has no input {name!r}; it has {list(specs)}")
                body_inputs.append(
                    {"name": name, "shape": tensors.shape_of(value), "datatype": datatype,
                     "data": tensors.flatten(value)}
                )  # fmt: skip
        body: dict[str, Any] = {"inputs": body_inputs}
        if timeout is not None:
            body["parameters"] = {"timeout": max(1, round(timeout * 1e6))}  # microseconds
        answer = self._json(
            "POST", model_path(model, version) + "/infer", json=body,
            timeout=self.timeout + (timeout if timeout is not None else 60.0),
        )  # fmt: skip
        return {
            str(out["name"]): tensors.from_v2(out["datatype"], out["shape"], out.get("data", []))
            for out in answer["outputs"]
        }
