"""/dead-letters: failed jobs to inspect, replay (same job id) or purge."""

from __future__ import annotations

from typing import Any

from app.operations.dead_letters import DeadLetter, Filters
from app.web.auth import authenticated, current_actor, current_tenant, operator_only
from app.web.blueprint import Blueprint, links_by_id
from app.web.context import services
from app.web.record_schemas import (
    BulkReplaySchema,
    DeadLetterListArgsSchema,
    DeadLetterPageSchema,
    DeadLetterSchema,
    ReplayResultSchema,
    TracebackSchema,
)

blp = Blueprint(
    "dead_letters", __name__, url_prefix="/dead-letters", description="Failed jobs, replayable"
)


def letter_links(pointer: str = "/id") -> dict[str, Any]:
    """What a client does with a dead letter it got: read it, replay it, purge it, and
    read its job."""
    return links_by_id(
        pointer,
        GetLetter="get /dead-letters/{letter_id}",
        ReplayLetter="post /dead-letters/{letter_id}/replay",
        PurgeLetter="delete /dead-letters/{letter_id}",
    ) | links_by_id(f"{pointer.removesuffix('/id')}/job_id", GetJob="get /jobs/{job_id}")


def _filters(args: dict[str, Any]) -> Filters:
    return Filters(
        **{k: args.get(k) for k in ("model", "error_code", "since", "until", "replayed")}
    )


@blp.get("")
@authenticated
@blp.arguments(DeadLetterListArgsSchema(), location="query")
@blp.response(200, DeadLetterPageSchema, links=letter_links("/items/0/id"))
def list_letters(args: dict[str, Any]) -> dict[str, Any]:
    items, next_cursor = services().dead_letters.list_letters(
        current_tenant(), _filters(args), args["limit"], args.get("cursor")
    )
    return {"items": items, "next_cursor": next_cursor}


@blp.get("/<int:letter_id>")
@blp.response(200, DeadLetterSchema, links=letter_links())
@blp.alt_response(404, response="NOT_FOUND")
@authenticated
def get_letter(letter_id: int) -> DeadLetter:
    return services().dead_letters.get(current_tenant(), letter_id)


@blp.get("/<int:letter_id>/traceback")
@blp.response(200, TracebackSchema)
@blp.alt_response(404, response="NOT_FOUND")
@operator_only
def letter_traceback(letter_id: int) -> dict[str, Any]:
    """An operator's view of any tenant's failure: the traceback names the
    service's own files and lines, which tenants are not shown."""
    letter = services().dead_letters.get(None, letter_id)
    return {"id": letter.id, "tenant_id": letter.tenant_id, "traceback": letter.traceback}


@blp.post("/<int:letter_id>/replay")
@blp.response(202, ReplayResultSchema, description="The job is queued again, same id")
@blp.alt_response(404, response="NOT_FOUND")
@blp.alt_response(409, response="CONFLICT", description="Already replayed, or not replayable")
@authenticated
def replay_letter(letter_id: int) -> dict[str, Any]:
    job_id = services().dead_letters.replay(current_tenant(), letter_id, current_actor())
    return {"replayed": 1, "job_ids": [job_id]}


@blp.post("/replay")
@authenticated
@blp.arguments(BulkReplaySchema())
@blp.response(202, ReplayResultSchema, description="Every matching letter not yet replayed")
def replay_matching(body: dict[str, Any]) -> dict[str, Any]:
    job_ids = services().dead_letters.replay_matching(
        current_tenant(), _filters(body), body["limit"], current_actor()
    )
    return {"replayed": len(job_ids), "job_ids": job_ids}


@blp.delete("/<int:letter_id>")
@blp.response(204)
@blp.alt_response(404, response="NOT_FOUND")
@authenticated
def purge_letter(letter_id: int) -> None:
    services().dead_letters.purge(current_tenant(), letter_id, current_actor())
