"""An S3-compatible blob store: the same content-addressed contract as the local one, on a bucket.

Keys are '<prefix>/ab/cdef...' (the local store's sharding). A blob appears under its key only once
complete: a single PUT, or a multipart upload (blobs above `multipart_threshold`) that becomes
visible at CompleteMultipartUpload, both atomic in S3; a failed multipart upload is aborted, and
`remove_stale_staging` (run by gc) aborts those left by crashed writers. Every read re-hashes the
bytes (IntegrityError when they changed); the sha256 is also stored as the object's metadata and,
on a single PUT, sent as S3's own x-amz-checksum-sha256, so S3 refuses bytes changed in transit.

Staging writes the object at once: S3 has no hidden write that costs less than a second copy, and
only bytes already hashed to their digest are staged, so an object is never under a wrong key.
Until the commit no version references it, so the registry never serves it; if the registration
is refused, `gc` deletes it after the grace period (never at once: another registration may have
found it present in the meantime and be about to reference it).

The endpoint comes from $NORMBRIDGE_S3_ENDPOINT (else $AWS_ENDPOINT_URL, else AWS itself) and the
credentials from the standard AWS environment/config. boto3 is imported only when an s3:// store
is opened.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import os
import time
from collections.abc import Callable, Iterable, Iterator
from urllib.parse import urlparse

from schemas.errors import NotFoundError, RegistryError

from .base import HEX_DIGITS, BlobStore, StagedBlob, check_digest, sha256_hex, stream_mismatch

ENDPOINT_ENV = "NORMBRIDGE_S3_ENDPOINT"
DEFAULT_MULTIPART_THRESHOLD = 64 * 1024 * 1024
MIN_PART_SIZE = 5 * 1024 * 1024  # S3's smallest part (all but the last)
#: From this size on a PUT first asks (HEAD) whether the blob is stored; a smaller one is sent at once, as a HEAD
#: costs a round trip like the PUT itself, and rewriting identical bytes under a content key changes nothing.
ASK_FIRST_BYTES = 1024 * 1024
_MISSING = {"404", "NoSuchKey", "NotFound"}


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """'s3://bucket/some/prefix' -> ('bucket', 'some/prefix'); the prefix may be empty."""
    parsed = urlparse(uri)
    if parsed.scheme.lower() != "s3" or not parsed.netloc:
        raise RegistryError(f"blob store URI {uri!r} is not an S3 URI; expected 's3://bucket/prefix'")
    return parsed.netloc, parsed.path.strip("/")


class S3BlobStore(BlobStore):
    """Blobs as objects '<prefix>/ab/cdef...' in `bucket`, each with metadata sha256=<digest>."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        client=None,
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        part_size: int | None = None,
    ):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        part_size = multipart_threshold if part_size is None else part_size
        if part_size < MIN_PART_SIZE:
            raise RegistryError(
                f"S3 part size {part_size} bytes is below S3's minimum of {MIN_PART_SIZE} bytes (5 MiB); use 5 MiB or more"
            )
        if multipart_threshold < 1:
            raise RegistryError(
                f"multipart threshold {multipart_threshold} bytes is not positive; pass at least 1 byte"
            )
        self.multipart_threshold = multipart_threshold
        self.list_page_size = 1000  # keys per ListObjectsV2 page (S3's maximum)
        self.stages_beside_gate = True  # PUTs wait on the network: staged while the gate runs
        # concurrent PUTs or GETs per registration, bundle or pull (boto3 clients are thread-safe; its pool holds 10)
        self.parallel_transfers = 4
        self.part_size = part_size
        self.endpoint_url = endpoint_url or os.environ.get(ENDPOINT_ENV) or os.environ.get("AWS_ENDPOINT_URL") or None
        if client is None:
            try:
                import boto3
            except ImportError:
                raise RegistryError(
                    f"blob store {self.uri} needs boto3, which is not installed; pip install boto3"
                ) from None
            from botocore.config import Config

            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
            # Every body carries a checksum header that is signed and that S3 verifies (x-amz-checksum-sha256 on a
            # PUT, botocore's CRC32 on a part), so hashing the body again to sign it, as botocore does over plain
            # HTTP, adds nothing; over HTTPS botocore already skips it.
            client = boto3.client(
                "s3",
                endpoint_url=self.endpoint_url,
                region_name=region,
                config=Config(s3={"payload_signing_enabled": False}),
            )
        self.client = client

    @classmethod
    def from_uri(cls, uri: str, **options) -> S3BlobStore:
        bucket, prefix = parse_s3_uri(uri)
        return cls(bucket, prefix, **options)

    def __repr__(self) -> str:
        return f"S3BlobStore({self.uri!r}, endpoint={self.endpoint_url!r})"

    # ------------------------------------------------------------------ keys and errors

    def key_of(self, digest: str) -> str:
        """The object key of `digest` (whether or not it exists)."""
        check_digest(digest)
        shard = f"{digest[:2]}/{digest[2:]}"
        return f"{self.prefix}/{shard}" if self.prefix else shard

    def _root(self) -> str:
        return f"{self.prefix}/" if self.prefix else ""

    def _refuse(self, error, action: str):
        """Turn an S3 error other than 'absent' into a RegistryError that says what to fix."""
        code = str(error.response.get("Error", {}).get("Code", ""))
        if code == "NoSuchBucket":
            return RegistryError(
                f"the bucket {self.bucket!r} of blob store {self.uri} does not exist; create it or fix the URI"
            )
        if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return RegistryError(
                f"{action} in blob store {self.uri} was refused ({code}); check the AWS credentials and bucket policy"
            )
        return RegistryError(f"{action} in blob store {self.uri} failed: {error}")

    def _head(self, digest: str) -> dict | None:
        from botocore.exceptions import ClientError

        try:
            return self.client.head_object(Bucket=self.bucket, Key=self.key_of(digest))
        except ClientError as error:
            if str(error.response.get("Error", {}).get("Code", "")) in _MISSING:
                return None
            raise self._refuse(error, f"HEAD of blob {digest}") from error

    def _head_or_missing(self, digest: str) -> dict:
        head = self._head(digest)
        if head is None:
            raise NotFoundError(f"blob {digest} is not in the blob store {self.uri}; check the digest")
        return head

    # ------------------------------------------------------------------ the BlobStore contract

    def put(self, data: bytes) -> str:
        """Upload `data` (idempotent); a large blob is not sent again when an object of its size is under its key."""
        return self._put(sha256_hex(data), data)

    def stage(self, data: bytes, digest: str | None = None, sync: bool = True) -> StagedBlob:
        """Upload now (see the module doc); `publish` then has nothing left to do."""
        return StagedBlob(digest=self._put(digest or sha256_hex(data), data))

    def stage_stream(self, chunks: Iterable[bytes], digest: str, size: int, sync: bool = True) -> StagedBlob:
        """A blob above the multipart threshold is uploaded part by part as its chunks arrive, hashed on the way, and
        completed only if it hashes to `digest` (else aborted: IntegrityError, no object);
        a smaller one is joined and PUT."""
        if size <= self.multipart_threshold:
            return super().stage_stream(chunks, digest, size, sync)
        head = self._head(digest)
        if head is not None and head.get("ContentLength") == size:
            return StagedBlob(digest=digest)  # stored already: not read again
        hashed, length = hashlib.sha256(), [0]

        def parts() -> Iterator[bytes]:
            buffer = bytearray()
            for chunk in chunks:
                hashed.update(chunk)
                length[0] += len(chunk)
                buffer += chunk
                while len(buffer) >= self.part_size:
                    yield bytes(buffer[: self.part_size])
                    del buffer[: self.part_size]
            if buffer:
                yield bytes(buffer)

        def verify() -> None:
            if hashed.hexdigest() != digest or length[0] != size:
                raise stream_mismatch(digest, hashed.hexdigest(), length[0], size)

        self._put_multipart(digest, parts(), verify)
        return StagedBlob(digest=digest)

    def _put(self, digest: str, data: bytes) -> str:
        if len(data) >= ASK_FIRST_BYTES:  # a large blob already stored is not sent again
            head = self._head(digest)
            if head is not None and head.get("ContentLength") == len(data):
                return digest
        if len(data) > self.multipart_threshold:
            view = memoryview(data)
            self._put_multipart(
                digest, (view[start : start + self.part_size] for start in range(0, len(data), self.part_size))
            )
        else:
            from botocore.exceptions import ClientError

            try:
                self.client.put_object(
                    Bucket=self.bucket,
                    Key=self.key_of(digest),
                    Body=data,
                    ContentType="application/octet-stream",
                    Metadata={"sha256": digest},
                    ChecksumSHA256=base64.b64encode(bytes.fromhex(digest)).decode(),
                )
            except ClientError as error:
                raise self._refuse(error, f"upload of blob {digest}") from error
        return digest

    def _put_multipart(self, digest: str, chunks: Iterable, verify: Callable[[], None] = lambda: None) -> None:
        """Parts (`chunks`, each but the last at least 5 MiB), then `verify()` and CompleteMultipartUpload (the object
        appears only then); aborted on any failure."""
        from botocore.exceptions import BotoCoreError, ClientError

        key = self.key_of(digest)
        try:
            upload = self.client.create_multipart_upload(
                Bucket=self.bucket, Key=key, ContentType="application/octet-stream", Metadata={"sha256": digest}
            )
        except ClientError as error:
            raise self._refuse(error, f"multipart upload of blob {digest}") from error
        upload_id = upload["UploadId"]
        try:
            parts = []
            for number, chunk in enumerate(chunks, start=1):
                response = self._upload_part(key, upload_id, number, chunk)
                parts.append({"ETag": response["ETag"], "PartNumber": number})
            verify()
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        except BaseException as failure:
            # The original failure is what matters; if the abort fails too, gc aborts what is left.
            with contextlib.suppress(ClientError, BotoCoreError):
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            if isinstance(failure, ClientError):
                raise self._refuse(failure, f"multipart upload of blob {digest}") from failure
            raise

    def _upload_part(self, key: str, upload_id: str, number: int, chunk: memoryview) -> dict:
        return self.client.upload_part(
            Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=io.BytesIO(chunk)
        )

    def get(self, digest: str) -> bytes:
        from botocore.exceptions import ClientError

        key = self.key_of(digest)
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
            return self.read_verified(digest, response["Body"].read)  # hashed as it streams in
        except ClientError as error:
            if str(error.response.get("Error", {}).get("Code", "")) in _MISSING:
                raise NotFoundError(
                    f"blob {digest} is not in the blob store {self.uri}; it was never stored or was removed by gc"
                ) from None
            raise self._refuse(error, f"read of blob {digest}") from error

    def head_of(self, digest: str, size: int) -> tuple[bytes, int]:
        """One ranged GET: the first `size` bytes and, from Content-Range, the object's whole length."""
        from botocore.exceptions import ClientError

        try:
            response = self.client.get_object(
                Bucket=self.bucket, Key=self.key_of(digest), Range=f"bytes=0-{max(size, 1) - 1}"
            )
            data = response["Body"].read()
        except ClientError as error:
            if str(error.response.get("Error", {}).get("Code", "")) in _MISSING:
                raise NotFoundError(
                    f"blob {digest} is not in the blob store {self.uri}; it was never stored or was removed by gc"
                ) from None
            raise self._refuse(error, f"read of blob {digest}") from error
        whole = response.get("ContentRange", "").rpartition("/")[2]
        return data[:size], int(whole) if whole.isdigit() else int(response["ContentLength"])

    def exists(self, digest: str) -> bool:
        return self._head(digest) is not None

    def delete(self, digest: str) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.key_of(digest))
        except ClientError as error:
            if str(error.response.get("Error", {}).get("Code", "")) not in _MISSING:
                raise self._refuse(error, f"delete of blob {digest}") from error

    def digests(self) -> Iterator[str]:
        from botocore.exceptions import ClientError

        root = self._root()
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(
                Bucket=self.bucket, Prefix=root, PaginationConfig={"PageSize": self.list_page_size}
            ):
                for entry in page.get("Contents", []):
                    rest = entry["Key"][len(root) :]
                    shard, _, name = rest.partition("/")
                    digest = shard + name
                    if len(shard) == 2 and len(digest) == 64 and set(digest) <= HEX_DIGITS:
                        yield digest
        except ClientError as error:
            raise self._refuse(error, "listing blobs") from error

    def size(self, digest: str) -> int:
        return int(self._head_or_missing(digest)["ContentLength"])

    def age_seconds(self, digest: str) -> float:
        modified = self._head_or_missing(digest)["LastModified"]
        return max(0.0, time.time() - modified.timestamp())

    def remove_stale_staging(self, older_than_seconds: float, keep: Callable[[str], bool] | None = None) -> int:
        """Abort multipart uploads under the prefix that crashed writers left, older than the given age (unless `keep`
        says so of the digest an upload is written as)."""
        from botocore.exceptions import ClientError

        removed = 0
        now = time.time()
        paginator = self.client.get_paginator("list_multipart_uploads")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._root()):
                for upload in page.get("Uploads", []):
                    if now - upload["Initiated"].timestamp() < older_than_seconds:
                        continue
                    if keep is not None and keep(upload["Key"][len(self._root()) :].replace("/", "", 1)):
                        continue
                    try:
                        self.client.abort_multipart_upload(
                            Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                        )
                        removed += 1
                    except ClientError as error:
                        if str(error.response.get("Error", {}).get("Code", "")) != "NoSuchUpload":
                            raise
        except ClientError as error:
            raise self._refuse(error, "aborting stale multipart uploads") from error
        return removed


def open_s3(uri: str) -> S3BlobStore:
    """The factory `open_blob_store` uses for 's3://bucket/prefix'."""
    return S3BlobStore.from_uri(uri)


__all__ = ["DEFAULT_MULTIPART_THRESHOLD", "ENDPOINT_ENV", "S3BlobStore", "open_s3", "parse_s3_uri"]
