"""Where a results path lives, decided in one place: a local folder or an object store.

Every verb (``sweep run/plan/status/report/query``, ``analysis.load``) goes through here, so a
URI is never folded into a local path and a custom S3 endpoint (MinIO, R2, moto, GCS's
interoperability mode) is configured once, by the standard environment:

    AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL)   endpoint, e.g. http://127.0.0.1:9000
    AWS_REGION (or AWS_DEFAULT_REGION)          region (us-east-1 when a custom endpoint has none)
    AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY   credentials (or the node's role, as usual)

pyarrow's filesystem lists and writes; Polars' ``scan_parquet`` gets the same endpoint as
``storage_options``.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

__all__ = [
    "ENDPOINT_VARS",
    "REMOTE_SCHEMES",
    "StorageError",
    "check_writable",
    "env_for_workers",
    "filesystem",
    "first_line",
    "is_remote",
    "join",
    "name",
    "normalize",
    "parent",
    "s3_endpoint",
    "location_problem",
    "scheme",
    "storage_options",
]

REMOTE_SCHEMES = ("s3", "gs", "gcs")
GCS_RETRY_S = 10
"""How long a GCS call retries before it fails (pyarrow's default is 15 minutes)."""
CHECK_S = 30.0
"""The longest check_writable waits for an object store's answer, whatever its client's retries."""
ENDPOINT_VARS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


class StorageError(ValueError):
    """The results location cannot be reached or written (one line, for the user)."""


def scheme(path: str | os.PathLike[str]) -> str | None:
    """``"s3"``, ``"gs"``, ... for an object-store URI; None for a local path (``file://`` too)."""
    text = os.fspath(path)
    if "://" not in text:
        return None
    s = text.split("://", 1)[0].lower()
    return None if s == "file" else s


def is_remote(path: str | os.PathLike[str]) -> bool:
    return scheme(path) is not None


def location_problem(path: str | os.PathLike[str]) -> str | None:
    """The one rule for a results location given by the user: why it names none (empty, a scheme
    not supported, a URI without a bucket, `s3:bucket` missing its //), or None."""
    text = os.fspath(path)
    if not text.strip():
        return "empty: name a folder or an s3:// / gs:// URI"
    if "\x00" in text:
        return "holds a NUL character"
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):", text)
    if m and "://" not in text[: len(m[0]) + 2] and m[1].lower() in REMOTE_SCHEMES:
        return f"looks like a URI without its //: write {m[1]}://{text[len(m[0]):].lstrip('/')}"
    s = scheme(text)
    if s is None:
        return None
    if s not in REMOTE_SCHEMES:
        return f"scheme {s}:// is not supported (s3://, gs://, or a local path)"
    if not text.split("://", 1)[1].split("/", 1)[0].strip():
        return f"no bucket: write {s}://<bucket>/<folder>"
    return None


def normalize(path: str | os.PathLike[str]) -> str:
    """A URI without trailing slash, or an absolute local path (trials chdir into Ray's folders).
    StorageError when it names no location (location_problem)."""
    text = os.fspath(path)
    problem = location_problem(text)
    if problem is not None:
        raise StorageError(f"{text!r}: {problem}" if not text.strip() else f"{text}: {problem}")
    if is_remote(text):
        return text.rstrip("/")
    return os.path.abspath(os.path.expanduser(text.removeprefix("file://")))


def join(base: str | os.PathLike[str], *parts: str) -> str:
    """``base/part/...`` without folding a URI's ``//``."""
    return "/".join([os.fspath(base).rstrip("/"), *(p.strip("/") for p in parts)])


def parent(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[0]


def name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def s3_endpoint() -> str | None:
    for var in ENDPOINT_VARS:
        if os.environ.get(var):
            return os.environ[var]
    return None


def _region() -> str | None:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")


def filesystem(path: str | os.PathLike[str]) -> tuple[Any, str]:
    """(pyarrow filesystem, the path within it) for a local path or an object-store URI."""
    import pyarrow.fs as pafs

    text = normalize(path)
    s = scheme(text)
    if s is None:
        return pafs.LocalFileSystem(), text
    if s == "s3":
        endpoint = s3_endpoint()
        # Explicit, so a custom endpoint is used for every call and a dead one fails in seconds
        # instead of pyarrow's default retries (and no region lookup against AWS).
        kw: dict[str, Any] = {"endpoint_override": endpoint} if endpoint else {}
        region = _region() or ("us-east-1" if endpoint else None)
        if region:
            kw["region"] = region
        fs = pafs.S3FileSystem(**kw, connect_timeout=5, request_timeout=30,
                               retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=2))
        return fs, text.split("://", 1)[1]
    if s in ("gs", "gcs"):
        import datetime

        try:  # pyarrow's default retries an unreachable GCS for 15 minutes: give up in seconds
            fs = pafs.GcsFileSystem(retry_time_limit=datetime.timedelta(seconds=GCS_RETRY_S))
        except Exception as exc:  # pyarrow built without GCS
            raise StorageError(f"{text}: {first_line(exc, None)}") from None
        return fs, text.split("://", 1)[1]
    try:
        return pafs.FileSystem.from_uri(text)
    except Exception as exc:  # unknown scheme, ...
        raise StorageError(f"{text}: {first_line(exc, None)}") from None


def storage_options(path: str | os.PathLike[str]) -> dict[str, str] | None:
    """Polars ``scan_parquet`` options for ``path``: the custom S3 endpoint, if any."""
    endpoint = s3_endpoint()
    if scheme(path) != "s3" or not endpoint:
        return None
    opts = {"aws_endpoint_url": endpoint, "aws_region": _region() or "us-east-1"}
    if endpoint.startswith("http://"):
        opts["aws_allow_http"] = "true"
    return opts


def env_for_workers() -> dict[str, str]:
    """The endpoint settings (never credentials) a Ray job forwards to its workers."""
    keys = (*ENDPOINT_VARS, "AWS_REGION", "AWS_DEFAULT_REGION")
    return {k: os.environ[k] for k in keys if os.environ.get(k)}


def check_writable(path: str | os.PathLike[str]) -> None:
    """Raise StorageError (one line) when ``path`` cannot be written: unreachable endpoint,
    missing bucket, refused credentials. Local folders are created on demand; nothing is written."""
    text = normalize(path)
    if not is_remote(text):
        return
    import pyarrow.fs as pafs

    fs, inner = filesystem(text)
    bucket = inner.split("/", 1)[0]
    where = f" at {s3_endpoint()}" if scheme(text) == "s3" and s3_endpoint() else ""
    answer: list = []

    def ask() -> None:
        try:
            info = fs.get_file_info(bucket)
            if info.type == pafs.FileType.NotFound:
                answer.append(StorageError(f"{text}: bucket '{bucket}' does not exist{where}"))
                return
            fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True))  # a listing: credentials
            answer.append(None)
        except OSError as exc:
            answer.append(StorageError(f"{text}: cannot access the results store{where}: {_reason(exc)}"))

    asking = threading.Thread(target=ask, daemon=True, name="check-writable")
    asking.start()
    asking.join(CHECK_S)
    if not answer:
        raise StorageError(f"{text}: no answer from the results store{where} in {CHECK_S:g} s (no network?)")
    if answer[0] is not None:
        raise answer[0]


def first_line(exc: BaseException, limit: int | None = 200) -> str:
    """The first line of an exception's message (its type's name when it has none), cut at
    `limit` characters: what a one-line error quotes."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:limit]


def _reason(exc: BaseException) -> str:
    text = first_line(exc, None)
    for marker, say in (("NETWORK_CONNECTION", "connection failed (is the endpoint up?)"),
                        ("OAuth2 access token", "no Google Cloud credentials or no network"),
                        ("ACCESS_DENIED", "access denied (check the credentials)"),
                        ("InvalidAccessKeyId", "access denied (unknown access key)"),
                        ("SignatureDoesNotMatch", "access denied (wrong secret key)"),
                        ("Forbidden", "access denied (check the credentials)")):
        if marker in text:
            return f"{say}; {text[:160]}"
    return text[:200]
