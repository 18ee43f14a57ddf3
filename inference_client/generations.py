"""`client.generations`: a chat model's text as jobs (POST /jobs with `messages`
or a `prompt`), whole, streamed piece by piece from the job's event stream, as
JSON under a schema (structured output), or as each candidate label's
probability (classification)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from inference_client.errors import JobFailed
from inference_client.resources import Job

if TYPE_CHECKING:
    from inference_client.client import Client

__all__ = ["Generations"]

Messages = Sequence[Mapping[str, str]]  # [{"role": "user", "content": "..."}, ...]


class Generations:
    """Generation jobs of a chat model (`client.generations`)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def create(
        self,
        model: str,
        *,
        messages: Messages | None = None,
        prompt: str | None = None,
        **parameters: Any,
    ) -> Job:
        """POST /jobs: a generation of `messages` (a chat) or of a `prompt`
        continued. `parameters` go to the service as given (it checks them):
        max_tokens, temperature, top_p, top_k, seed, stop, presence_penalty,
        frequency_penalty, repetition_penalty, logit_bias, logprobs,
        top_logprobs, response_format, labels. The finished job's `outputs`
        hold `text`, `finish_reason` and the token counts."""
        if (messages is None) == (prompt is None):
            raise ValueError("give either messages or prompt")
        inputs: dict[str, Any] = (
            {"messages": [dict(message) for message in messages]}
            if messages is not None
            else {"prompt": prompt}
        )
        body = {"model": model, "inputs": inputs, "parameters": parameters}
        return Job.from_json(self._client._json("POST", "/jobs", json=body))

    def structured(
        self,
        model: str,
        *,
        schema: Mapping[str, Any],
        messages: Messages | None = None,
        prompt: str | None = None,
        name: str = "response",
        strict: bool = True,
        **parameters: Any,
    ) -> Any:
        """The answer as JSON that validates against `schema` (a JSON Schema; the
        service decodes under it), parsed: a generation with `response_format`
        `json_schema`, waited for. JobFailed if it did not succeed."""
        if "response_format" in parameters:
            raise TypeError("structured() sets response_format from schema")
        json_schema = {"name": name, "schema": dict(schema), "strict": strict}
        response_format = {"type": "json_schema", "json_schema": json_schema}
        job = self.create(model, messages=messages, prompt=prompt,
                          response_format=response_format, **parameters)  # fmt: skip
        return json.loads(self._output(job, "text"))

    def classify(
        self,
        model: str,
        *,
        labels: Sequence[str],
        messages: Messages | None = None,
        prompt: str | None = None,
    ) -> dict[str, float]:
        """Each of `labels` with its probability as the answer (they sum to 1),
        scored by the service from one reading of the prompt rather than
        generated. JobFailed if the job did not succeed."""
        job = self.create(model, messages=messages, prompt=prompt, labels=list(labels))
        scores = json.loads(self._output(job, "label_scores"))
        return {str(label): float(score) for label, score in scores.items()}

    def stream(
        self,
        model: str,
        *,
        messages: Messages | None = None,
        prompt: str | None = None,
        **parameters: Any,
    ) -> Iterator[str]:
        """The generation's text as it is made: the job is submitted now, its
        pieces are read from its event stream (resumed where it dropped, so none
        is missed or repeated) as they are iterated; joined, they are the job's
        `outputs["text"]`. JobFailed at the end if it did not succeed."""
        job = self.create(model, messages=messages, prompt=prompt, **parameters)
        return self._pieces(job.id)

    def _pieces(self, job_id: str) -> Iterator[str]:
        for event in self._client.jobs.events(job_id):
            if event.text is not None:
                yield event.text
            elif event.terminal and event.job is not None and not event.job.succeeded:
                raise JobFailed(event.job)

    def _output(self, job: Job, name: str) -> str:
        """The finished job's output `name` (JSON text), waited for."""
        finished = job if job.finished else self._client.jobs.wait(job.id)
        if not finished.succeeded or finished.outputs is None or name not in finished.outputs:
            raise JobFailed(finished)
        return str(finished.outputs[name])
