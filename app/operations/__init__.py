"""The operations every door calls, one module per domain (jobs, calls, batches,
files, dead letters, schedules, bindings, models, tenants, webhooks, status; and
the workers' execution and maintenance), each built by the container
(`container.jobs`, `container.batches`, ...) with only what it uses.

An operation is one unit of work (`app.platform.database.transactional`) or a
read that opens none; a loop that must commit as it goes (a batch's split, a
sweep, a webhook's attempt) is a sequence of units. A door decodes its protocol
into the typed requests below, calls one operation with the caller's tenant,
and maps what comes back (or the `app.errors` it raised) to its protocol. Each
operations module also names the domain's types its callers read, so a door
imports operations and the container, never a domain's internals.
"""

from app.operations.requests import (
    BatchRequest,
    BindingFields,
    EntryRequest,
    InferRequest,
    JobQuery,
    JobRequest,
    ScheduleFields,
    ScheduleInput,
    Wait,
    Webhook,
)
from app.tenancy.keys import OPERATOR, Caller, TenantRef

__all__ = [
    "OPERATOR",
    "BatchRequest",
    "BindingFields",
    "Caller",
    "EntryRequest",
    "InferRequest",
    "JobQuery",
    "JobRequest",
    "ScheduleFields",
    "ScheduleInput",
    "TenantRef",
    "Wait",
    "Webhook",
]
