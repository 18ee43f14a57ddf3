"""S3 for the tests: moto's server on a free loopback port stands in for S3 (real S3
itself is not tested), with one bucket and dummy credentials. The file store reaches it
through s3fs with the storage options below (what FILE_STORE_OPTIONS holds in
production); the tests look at the bucket through boto3, beside the store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

KEY = SECRET = "testing"
REGION = "us-east-1"
# s3fs's smallest block (S3's smallest part) instead of its 50 MiB default: a write of a
# few MiB is then already a multipart upload, as a large one is in production.
BLOCK = 5 * 1024 * 1024


@dataclass(frozen=True)
class S3:
    endpoint: str  # http://127.0.0.1:<port>
    bucket: str
    client: Any  # boto3's S3 client of the same server

    @property
    def options(self) -> dict[str, Any]:
        """s3fs's storage options for this server (FILE_STORE_OPTIONS, parsed)."""
        return {
            "endpoint_url": self.endpoint,
            "key": KEY,
            "secret": SECRET,
            "client_kwargs": {"region_name": REGION},
            "default_block_size": BLOCK,
        }

    @property
    def options_json(self) -> str:
        return json.dumps(self.options)

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def objects(self, prefix: str) -> dict[str, int]:
        """Every object under `prefix/` (its key below the prefix: its size), as S3 lists it."""
        found: dict[str, int] = {}
        pages = self.client.get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=self.bucket, Prefix=f"{prefix}/"):
            for item in page.get("Contents", []):
                found[item["Key"].removeprefix(f"{prefix}/")] = item["Size"]
        return found

    def unfinished_uploads(self, prefix: str) -> list[str]:
        """Multipart uploads begun under `prefix/` and neither completed nor aborted
        (S3 keeps their parts, and bills them, until they are)."""
        listed = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=f"{prefix}/")
        return [upload["Key"] for upload in listed.get("Uploads", [])]


@contextmanager
def moto_s3(bucket: str) -> Iterator[S3]:
    """moto's S3 server in a thread of this process, on 127.0.0.1 and a port the system
    picked, holding `bucket`; stopped at the end."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer("127.0.0.1", 0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        client = boto3.client(
            "s3", endpoint_url=endpoint, region_name=REGION,
            aws_access_key_id=KEY, aws_secret_access_key=SECRET,
        )  # fmt: skip
        client.create_bucket(Bucket=bucket)
        yield S3(endpoint, bucket, client)
    finally:
        server.stop()
