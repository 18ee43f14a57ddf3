#!/usr/bin/env python
"""The service's command line (app.cli.main): up, worker, grpc, db, create-api-key,
models, schedules, streams, bench, ..."""

from app.cli.main import cli

if __name__ == "__main__":
    cli()
