"""A real S3-compatible HTTP server for tests: moto in server mode on 127.0.0.1, a free port.

`moto_s3` (module scope) starts one ThreadedMotoServer per test module and stops it afterwards;
`s3_env` points the AWS environment (endpoint, dummy credentials, region) at it and gives each
test a fresh bucket. boto3 is not mocked: every call goes over HTTP to the server.
"""

from __future__ import annotations

import urllib.request
import uuid

import pytest


@pytest.fixture(scope="module")
def moto_s3():
    """The endpoint URL of a moto server running on a free loopback port."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        with urllib.request.urlopen(f"{endpoint}/moto-api/reset", data=b"", timeout=10) as response:
            assert response.status == 200
        yield endpoint
    finally:
        server.stop()


@pytest.fixture
def s3_env(moto_s3, monkeypatch):
    """Environment pointed at the moto server; returns (endpoint, a fresh empty bucket, a boto3 client)."""
    import boto3

    monkeypatch.setenv("NORMBRIDGE_S3_ENDPOINT", moto_s3)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    bucket = f"nb-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=moto_s3, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    return moto_s3, bucket, client
