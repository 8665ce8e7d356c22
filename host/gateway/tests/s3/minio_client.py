"""minio-py against the gateway's S3 front (run by tests/s3.rs).

minio-py reads an error only from a body typed `application/xml`: any
other error answer is an InvalidResponseError with no S3 code. So every
refusal here must come back as an S3Error whose code is the gateway's.

Environment: S3_ENDPOINT (http://host:port), S3_KEY/S3_SECRET (every
right), READER_KEY/READER_SECRET (read only), TOKEN_A (a grant released,
so stale once TOKEN_B has written), TOKEN_B (the current grant).
"""

import io
import os
import sys
from urllib.parse import urlparse

import urllib3
from minio import Minio
from minio.error import S3Error

BUCKET = "reports"
KEY = "minio/report.csv"


class Fenced(urllib3.PoolManager):
    """Adds headers to every request: minio-py's remove_object and
    put_object take no headers of their own, so a Fence-Token on a DELETE
    (or an If-None-Match on a PUT) goes this way. Unsigned extra headers
    are allowed by SigV4."""

    def __init__(self, headers):
        super().__init__()
        self.extra = headers

    def urlopen(self, method, url, redirect=True, **kw):
        headers = dict(kw.get("headers") or {})
        headers.update(self.extra)
        kw["headers"] = headers
        return super().urlopen(method, url, redirect=redirect, **kw)


def client(key=None, secret=None, headers=None):
    endpoint = urlparse(os.environ["S3_ENDPOINT"]).netloc
    return Minio(
        endpoint,
        access_key=key or os.environ["S3_KEY"],
        secret_key=secret or os.environ["S3_SECRET"],
        secure=False,
        region="us-east-1",
        http_client=Fenced(headers) if headers else None,
    )


def put(c, body, token=None, key=KEY):
    metadata = {"fence-token": token} if token else None
    return c.put_object(BUCKET, key, io.BytesIO(body), len(body), metadata=metadata)


def get(c, key=KEY, headers=None):
    r = c.get_object(BUCKET, key, request_headers=headers)
    try:
        return r.read()
    finally:
        r.close()
        r.release_conn()


def refused(code, status, call, typed=True):
    """`call` raises an S3Error with `code` and `status`; `typed`: read from
    an XML body (not guessed by minio-py from the status of a HEAD)."""
    try:
        call()
    except S3Error as e:
        assert e.code == code, f"expected {code}, got {e.code}: {e}"
        assert e.response.status == status, f"{code}: status {e.response.status}"
        ctype = e.response.headers.get("content-type", "")
        assert ctype == "application/xml", f"{code}: Content-Type {ctype!r}"
        if typed:
            assert e.message, f"{code}: no message read from the body"
        return e
    raise AssertionError(f"expected {code}, the call succeeded")


def fenced():
    a, b = os.environ["TOKEN_A"], os.environ["TOKEN_B"]
    root = client()
    reader = client(os.environ["READER_KEY"], os.environ["READER_SECRET"])

    # Put and get under the current grant.
    put(root, b"from B", b)
    assert get(root) == b"from B"
    assert reader.stat_object(BUCKET, KEY).size == 6

    # The paused writer: its PUT is StaleFence, read from the typed body,
    # and the object is still B's.
    e = refused("StaleFence", 409, lambda: put(root, b"from A", a))
    assert "newer fencing token" in e.message, e.message
    assert e.response.headers.get("fence-token-highest") == b, e.response.headers
    assert get(root) == b"from B"

    # No token at all; no write right; no such key, bucket or version.
    refused("MissingFenceToken", 428, lambda: put(root, b"x"))
    refused("AccessDenied", 403, lambda: put(reader, b"x", b))
    refused("NoSuchKey", 404, lambda: get(root, "minio/absent"))
    refused("NoSuchBucket", 404, lambda: root.get_object("nosuchbucket", KEY))
    refused("NoSuchKey", 404, lambda: root.stat_object(BUCKET, "minio/absent"), typed=False)

    # Conditional failures: a read whose If-Match names another ETag, and
    # a create-only write (If-None-Match: *) of a key that exists.
    refused(
        "PreconditionFailed", 412, lambda: get(root, headers={"If-Match": '"0123"'})
    )
    refused(
        "PreconditionFailed",
        412,
        lambda: put(client(headers={"If-None-Match": "*"}), b"again", b),
    )
    refused(
        "InvalidRange", 416, lambda: root.get_object(BUCKET, KEY, offset=100, length=5)
    )
    assert get(root) == b"from B"

    # Delete: remove_object sends no token of its own (MissingFenceToken),
    # a stale one is StaleFence, the current one (guarded) deletes.
    refused("MissingFenceToken", 428, lambda: root.remove_object(BUCKET, KEY))
    refused(
        "StaleFence",
        409,
        lambda: client(headers={"Fence-Token": a}).remove_object(BUCKET, KEY),
    )
    assert get(root) == b"from B"
    # An unguarded write may not repeat a token (design §3): B's delete
    # goes with an Idempotency-Key.
    refused(
        "StaleFence",
        409,
        lambda: client(headers={"Fence-Token": b}).remove_object(BUCKET, KEY),
    )
    client(headers={"Fence-Token": b, "Idempotency-Key": "b-delete-1"}).remove_object(
        BUCKET, KEY
    )
    refused("NoSuchKey", 404, lambda: get(root))
    # A bad signature is s3s's own refusal, typed as well.
    refused(
        "SignatureDoesNotMatch",
        403,
        lambda: get(client(os.environ["S3_KEY"], "wrong-secret-0123456789abcdefghijkl")),
    )
    print("minio fenced: ok")


if __name__ == "__main__":
    {"fenced": fenced}[sys.argv[1]]()
