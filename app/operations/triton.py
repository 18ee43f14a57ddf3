"""Triton's model configuration and statistics extensions, as Triton's JSON.

One builder each, for both KServe v2 doors: the HTTP door answers the dicts as
they are (`GET /v2/models/<m>/config`, `.../stats`); the gRPC door parses them
into its `ModelConfig` and `ModelStatisticsResponse` messages (the field names
are the protobuf messages' own, as Triton's JSON writes them), so both answer
the same. Plain data here: no protobuf, no gRPC.
"""

from __future__ import annotations

from typing import Any

from app.cards import ModelCard, TensorSpec
from app.jobs.statistics import VersionStatistics

# Server metadata's `extensions`, by Triton's names for them: the model repository's
# with its optional `unload_dependents` component (our models have no dependents).
EXTENSIONS = (
    "model_configuration",
    "statistics",
    "model_repository",
    "model_repository(unload_dependents)",
)


def model_config(card: ModelCard) -> dict[str, Any]:
    """Triton's model configuration for `card`: with a batch dimension, `dims`
    leave it out (Triton's convention) and `max_batch_size` says its bound. A
    generative model is decoupled (ModelStreamInfer answers it piece by piece).
    A load's `config` parameter is read back onto the cards by
    `app.repository.overrides`, its inverse for what a card can say."""
    batching = card.batching.max_batch_size
    skip = 1 if batching > 0 else 0
    config: dict[str, Any] = {
        "name": card.name,
        "platform": card.platform,
        "backend": card.backend,
        "max_batch_size": batching,
        "input": [_tensor(spec, skip) for spec in card.inputs],
        "output": [_tensor(spec, skip) for spec in card.outputs],
    }
    if batching > 0 and card.steps is None:  # (an ensemble schedules by its steps)
        delay_us = int(card.batching.max_queue_delay_ms * 1000)
        config["dynamic_batching"] = {"max_queue_delay_microseconds": delay_us}
    if card.generation is not None:
        config["model_transaction_policy"] = {"decoupled": True}
    if card.steps is not None:
        config["ensemble_scheduling"] = card.steps.triton()
    policy = version_policy(card)
    if policy is not None:
        config["version_policy"] = policy
    if card.parameters:
        config["parameters"] = {k: {"string_value": v} for k, v in card.parameters.items()}
    return config


def version_policy(card: ModelCard) -> dict[str, Any] | None:
    """The card's version policy as Triton's `ModelVersionPolicy`; None for a
    `specific` list naming a version that is not a number (Triton's are int64)."""
    policy = card.version_policy
    if policy.latest is not None:
        return {"latest": {"num_versions": policy.latest}}
    if policy.specific is not None:
        if not all(v.isdigit() for v in policy.specific):
            return None
        return {"specific": {"versions": [int(v) for v in policy.specific]}}
    return {"all": {}}


def _tensor(spec: TensorSpec, skip: int) -> dict[str, Any]:
    data_type = "TYPE_STRING" if spec.datatype == "BYTES" else f"TYPE_{spec.datatype}"
    return {"name": spec.name, "data_type": data_type, "dims": list(spec.shape[skip:])}


def model_statistics(card: ModelCard, figures: VersionStatistics | None) -> dict[str, Any]:
    """Triton's `$model_stat` for one model version (zeros where nothing ran).
    What each figure means, and what the service cannot split (compute_input and
    compute_output: count with 0 ns): `app.jobs.statistics`."""
    f = figures or VersionStatistics()
    succeeded = f.succeeded
    return {
        "name": card.name,
        "version": card.version,
        "last_inference": f.last_ms,
        "inference_count": f.inferences,
        "execution_count": succeeded,  # one per request: micro-batches are not recorded
        "inference_stats": {
            "success": _duration(succeeded, f.success_ns),
            "fail": _duration(f.failed, f.fail_ns),
            "queue": _duration(succeeded, f.queue_ns),
            "compute_input": _duration(succeeded, 0),
            "compute_infer": _duration(succeeded, f.compute_ns),
            "compute_output": _duration(succeeded, 0),
            "cache_hit": _duration(0, 0),  # no response cache
            "cache_miss": _duration(0, 0),
        },
        "response_stats": {},
        "batch_stats": [],  # the sizes of the micro-batches are not recorded
        "memory_usage": [],
    }


def _duration(count: int, ns: int) -> dict[str, int]:
    return {"count": count, "ns": ns}
