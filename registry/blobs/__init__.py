"""Blob stores by URI scheme: the one table that maps 'file' and 's3' to a store.

The base class is registry/blobs/base.py and each store its own module (local.py, s3.py); only
this table knows them all. s3.py imports boto3 only when an s3:// store is opened.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from urllib.parse import unquote, urlparse

from schemas.errors import RegistryError

from .base import BlobStore
from .local import LocalBlobStore
from .s3 import open_s3


def _open_file(uri: str) -> BlobStore:
    parsed = urlparse(uri)
    if parsed.netloc not in ("", "localhost"):
        raise RegistryError(
            f"blob store URI {uri!r} names host {parsed.netloc!r}; a file URI must be local, e.g. 'file:///abs/path'"
        )
    return LocalBlobStore(unquote(parsed.path))


#: URI scheme -> factory.
SCHEMES: dict[str, Callable[[str], BlobStore]] = {"file": _open_file, "s3": open_s3}


def open_blob_store(uri: str | os.PathLike) -> BlobStore:
    """Open a blob store from 'file:///abs/path', a plain path or 's3://bucket/prefix'."""
    text = os.fspath(uri)
    scheme = urlparse(text).scheme
    # A plain path has no scheme (or a one-letter Windows drive).
    if not scheme or (len(scheme) == 1 and os.name == "nt"):
        return LocalBlobStore(text)
    factory = SCHEMES.get(scheme.lower())
    if factory is None:
        raise RegistryError(
            f"blob store URI {text!r} has the unknown scheme {scheme!r}; "
            f"currently registered schemes are {', '.join(sorted(SCHEMES))}"
        )
    return factory(text)


__all__ = ["SCHEMES", "open_blob_store"]
