"""boto3 scenarios against the gateway's S3 front, run by tests/s3.rs.

Each scenario is a function; `python3 clients.py NAME` runs one and exits
non-zero with the failed assertion. The endpoint and credentials come from
the environment (S3_ENDPOINT, S3_KEY, S3_SECRET; READER_KEY, READER_SECRET
for a principal that may only read; TOKEN_A < TOKEN_B, fencing tokens the
test acquired from the gateway's lock endpoints).
"""

import base64
import datetime
import hashlib
import json
import os
import sys
import urllib.request

import boto3
import botocore
import botocore.auth
from botocore.config import Config

ENDPOINT = os.environ["S3_ENDPOINT"]


def client(key=None, secret=None, fence=None, op_id=None):
    """A boto3 client; with `fence`, every request carries Fence-Token
    (an event hook: how an SDK sends a header it has no parameter for),
    with `op_id` an Idempotency-Key."""
    c = boto3.client(
        "s3",
        endpoint_url=ENDPOINT,
        aws_access_key_id=key or os.environ["S3_KEY"],
        aws_secret_access_key=secret or os.environ["S3_SECRET"],
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )
    if fence is not None:

        def add_fence(request, **_):
            request.headers["Fence-Token"] = fence
            if op_id is not None:
                request.headers["Idempotency-Key"] = op_id

        c.meta.events.register("before-sign.s3.*", add_fence)
    return c


def refused(call, code, status):
    """`call` must fail with S3 error `code` and HTTP `status`."""
    try:
        call()
    except botocore.exceptions.ClientError as e:
        got = (e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"])
        assert got == (code, status), f"expected {code} {status}, got {got}: {e.response['Error']}"
        return e.response
    raise AssertionError(f"expected {code} {status}, the call succeeded")


def absent(c, key):
    refused(lambda: c.head_object(Bucket="reports", Key=key), "404", 404)


def paused_writer():
    """The seed's paused writer with two boto3 clients: B (the newer
    token) writes; A wakes with its older token and is refused with
    StaleFence, by metadata or by header, for a PUT and for a DELETE, and
    B's object stays visible."""
    a_token, b_token = os.environ["TOKEN_A"], os.environ["TOKEN_B"]
    a, b = client(), client()
    key = "paused/report.csv"
    put = b.put_object(Bucket="reports", Key=key, Body=b"from-b", Metadata={"fence-token": b_token})
    assert put["ETag"] == '"%s"' % hashlib.md5(b"from-b").hexdigest(), put["ETag"]
    assert put["ResponseMetadata"]["HTTPHeaders"]["fence-token"] == b_token
    version = put["VersionId"]
    err = refused(
        lambda: a.put_object(Bucket="reports", Key=key, Body=b"from-a", Metadata={"fence-token": a_token}),
        "StaleFence",
        409,
    )
    headers = err["ResponseMetadata"]["HTTPHeaders"]
    assert headers["fence-token-presented"] == a_token, headers
    assert headers["fence-token-highest"] == b_token, headers
    # The same through the Fence-Token header, and for a delete.
    a_header = client(fence=a_token)
    refused(lambda: a_header.put_object(Bucket="reports", Key=key, Body=b"from-a"), "StaleFence", 409)
    refused(lambda: a_header.delete_object(Bucket="reports", Key=key), "StaleFence", 409)
    got = b.get_object(Bucket="reports", Key=key)
    assert got["Body"].read() == b"from-b"
    assert got["Metadata"]["fence-token"] == b_token, got["Metadata"]
    assert got["VersionId"] == version
    # B deletes with its token again: an unguarded write may not repeat a
    # token (design §3), so with an Idempotency-Key. The key is gone.
    refused(lambda: client(fence=b_token).delete_object(Bucket="reports", Key=key), "StaleFence", 409)
    client(fence=b_token, op_id="b-delete-1").delete_object(Bucket="reports", Key=key)
    absent(b, key)


def refusals():
    """Every bad request is refused with S3's error and leaves nothing
    visible: no token, a wrong secret, an unknown key id, an expired
    signature date, a Content-MD5 or a checksum that does not match, a
    reader that writes, a bucket the gateway does not serve, a key `..`."""
    c = client()
    refused(lambda: c.put_object(Bucket="reports", Key="r/none", Body=b"x"), "MissingFenceToken", 428)
    absent(c, "r/none")
    wrong = client(secret="not-the-secret-at-all-0000")
    refused(
        lambda: wrong.put_object(Bucket="reports", Key="r/wrong", Body=b"x", Metadata={"fence-token": "1.1"}),
        "SignatureDoesNotMatch",
        403,
    )
    absent(c, "r/wrong")
    unknown = client(key="AKIANOBODY0000")
    refused(lambda: unknown.list_objects_v2(Bucket="reports"), "InvalidAccessKeyId", 403)
    # A signature dated an hour ago (S3 allows 15 minutes of skew).
    real = botocore.auth.get_current_datetime
    botocore.auth.get_current_datetime = lambda: real() - datetime.timedelta(hours=1)
    try:
        refused(
            lambda: c.put_object(Bucket="reports", Key="r/old", Body=b"x", Metadata={"fence-token": "1.1"}),
            "RequestTimeTooSkewed",
            403,
        )
    finally:
        botocore.auth.get_current_datetime = real
    absent(c, "r/old")
    bad_md5 = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    refused(
        lambda: c.put_object(
            Bucket="reports", Key="r/md5", Body=b"x", ContentMD5=bad_md5, Metadata={"fence-token": "1.1"}
        ),
        "BadDigest",
        400,
    )
    absent(c, "r/md5")
    bad_sha = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
    refused(
        lambda: c.put_object(
            Bucket="reports", Key="r/sha", Body=b"x", ChecksumSHA256=bad_sha, Metadata={"fence-token": "1.1"}
        ),
        "BadDigest",
        400,
    )
    absent(c, "r/sha")
    reader = client(os.environ["READER_KEY"], os.environ["READER_SECRET"])
    refused(
        lambda: reader.put_object(Bucket="reports", Key="r/reader", Body=b"x", Metadata={"fence-token": "1.1"}),
        "AccessDenied",
        403,
    )
    absent(c, "r/reader")
    refused(lambda: c.list_objects_v2(Bucket="nosuch"), "NoSuchBucket", 404)
    refused(
        lambda: c.put_object(Bucket="reports", Key="r/../x", Body=b"x", Metadata={"fence-token": "1.1"}),
        "InvalidArgument",
        400,
    )


def objects():
    """What a client reads back: ranges, ETags (MD5), versions, the
    default trailing CRC32 checksum of current SDKs verified, listings with
    a delimiter and continuation, presigned GETs, conditional writes."""
    c = client()
    body = bytes(range(256)) * 64
    put = c.put_object(
        Bucket="reports", Key="o/data.bin", Body=body, ChecksumAlgorithm="CRC32",
        Metadata={"fence-token": "3.1"},
    )
    assert put["ETag"] == '"%s"' % hashlib.md5(body).hexdigest()
    got = c.get_object(Bucket="reports", Key="o/data.bin", Range="bytes=100-199")
    assert got["Body"].read() == body[100:200]
    assert got["ContentRange"] == f"bytes 100-199/{len(body)}", got["ContentRange"]
    refused(lambda: c.get_object(Bucket="reports", Key="o/data.bin", Range=f"bytes={len(body)}-"), "InvalidRange", 416)
    head = c.head_object(Bucket="reports", Key="o/data.bin")
    assert head["ContentLength"] == len(body) and head["ETag"] == put["ETag"]
    # User metadata is kept (2 KiB at most, as in S3); the token is the
    # writer's, served from the object itself.
    meta = {"owner": "ops", "mtime": "1700000000.5"}
    c.put_object(Bucket="reports", Key="m/meta.txt", Body=b"m", Metadata={"fence-token": "3.1", **meta})
    assert c.head_object(Bucket="reports", Key="m/meta.txt")["Metadata"] == {"fence-token": "3.1", **meta}
    assert c.get_object(Bucket="reports", Key="m/meta.txt")["Metadata"] == {"fence-token": "3.1", **meta}
    refused(
        lambda: c.put_object(
            Bucket="reports", Key="m/meta.txt", Body=b"n", Metadata={"fence-token": "3.2", "big": "x" * 2100}
        ),
        "MetadataTooLarge",
        400,
    )
    assert c.get_object(Bucket="reports", Key="m/meta.txt")["Body"].read() == b"m"
    # Conditional reads as S3 decides them: the ETag condition of a kind
    # wins over the date condition of the same kind.
    get = lambda **kw: c.get_object(Bucket="reports", Key="o/data.bin", **kw)  # noqa: E731
    then, hour = head["LastModified"], datetime.timedelta(hours=1)
    refused(lambda: get(IfNoneMatch=put["ETag"]), "304", 304)
    refused(lambda: get(IfModifiedSince=then), "304", 304)
    refused(lambda: c.head_object(Bucket="reports", Key="o/data.bin", IfModifiedSince=then), "304", 304)
    assert get(IfModifiedSince=then - hour)["Body"].read() == body
    assert get(IfNoneMatch='"0000"', IfModifiedSince=then)["Body"].read() == body
    refused(lambda: get(IfMatch='"0000"'), "PreconditionFailed", 412)
    refused(lambda: get(IfUnmodifiedSince=then - hour), "PreconditionFailed", 412)
    refused(lambda: c.head_object(Bucket="reports", Key="o/data.bin", IfUnmodifiedSince=then - hour), "412", 412)
    assert get(IfUnmodifiedSince=then)["ETag"] == put["ETag"]
    assert get(IfMatch=put["ETag"], IfUnmodifiedSince=then - hour)["ETag"] == put["ETag"]
    # If-None-Match: * creates only; If-Match guards on the ETag.
    refused(
        lambda: c.put_object(
            Bucket="reports", Key="o/data.bin", Body=b"x", IfNoneMatch="*", Metadata={"fence-token": "3.2"}
        ),
        "PreconditionFailed",
        412,
    )
    refused(
        lambda: c.put_object(
            Bucket="reports", Key="o/data.bin", Body=b"x", IfMatch='"0000"', Metadata={"fence-token": "3.2"}
        ),
        "PreconditionFailed",
        412,
    )
    again = c.put_object(
        Bucket="reports", Key="o/data.bin", Body=b"y", IfMatch=put["ETag"], Metadata={"fence-token": "3.2"}
    )
    assert int(again["VersionId"]) > int(put["VersionId"])
    for i in range(5):
        c.put_object(Bucket="reports", Key=f"o/list/{i}.txt", Body=b"x", Metadata={"fence-token": "3.3"})
    c.put_object(Bucket="reports", Key="o/list/sub/deep.txt", Body=b"x", Metadata={"fence-token": "3.3"})
    page = c.list_objects_v2(Bucket="reports", Prefix="o/list/", Delimiter="/", MaxKeys=3)
    assert [o["Key"] for o in page["Contents"]] == ["o/list/0.txt", "o/list/1.txt", "o/list/2.txt"], page
    assert page["IsTruncated"] and page["KeyCount"] == 3
    rest = c.list_objects_v2(
        Bucket="reports", Prefix="o/list/", Delimiter="/", ContinuationToken=page["NextContinuationToken"]
    )
    assert [o["Key"] for o in rest["Contents"]] == ["o/list/3.txt", "o/list/4.txt"], rest
    assert [p["Prefix"] for p in rest["CommonPrefixes"]] == ["o/list/sub/"], rest
    assert not rest["IsTruncated"]
    every = c.get_paginator("list_objects_v2").paginate(Bucket="reports", Prefix="o/", PaginationConfig={"PageSize": 2})
    keys = [o["Key"] for p in every for o in p.get("Contents", [])]
    assert keys == sorted(keys) and len(keys) == 7, keys
    # ListObjects version 1: Marker / NextMarker, the same pages.
    v1 = c.list_objects(Bucket="reports", Prefix="o/list/", Delimiter="/", MaxKeys=3)
    assert [o["Key"] for o in v1["Contents"]] == ["o/list/0.txt", "o/list/1.txt", "o/list/2.txt"], v1
    assert v1["IsTruncated"] and v1["NextMarker"] == "o/list/2.txt", v1
    v1 = c.list_objects(Bucket="reports", Prefix="o/list/", Delimiter="/", Marker=v1["NextMarker"])
    assert [o["Key"] for o in v1["Contents"]] == ["o/list/3.txt", "o/list/4.txt"], v1
    assert [p["Prefix"] for p in v1["CommonPrefixes"]] == ["o/list/sub/"] and not v1["IsTruncated"], v1
    v1 = c.list_objects(Bucket="reports", Prefix="o/list/", Delimiter="/", Marker="o/list/sub/")
    assert "Contents" not in v1 and "CommonPrefixes" not in v1, v1
    every = c.get_paginator("list_objects").paginate(Bucket="reports", Prefix="o/", PaginationConfig={"PageSize": 2})
    assert [o["Key"] for p in every for o in p.get("Contents", [])] == keys
    url = c.generate_presigned_url("get_object", Params={"Bucket": "reports", "Key": "o/data.bin"}, ExpiresIn=300)
    with urllib.request.urlopen(url) as r:
        assert r.read() == b"y"
    # Bucket-level calls SDKs and tools make.
    c.head_bucket(Bucket="reports")
    assert "reports" in [b["Name"] for b in c.list_buckets()["Buckets"]]


def copies():
    """CopyObject is a fenced write of the destination with the copier's
    token (the header, or the new metadata with REPLACE; never the
    source's metadata); the source's conditions, rights and S3's rules;
    UploadPartCopy with ranges, and boto3's managed copy that uses it."""
    c = client()
    body = os.urandom(100_000)
    etag = '"%s"' % hashlib.md5(body).hexdigest()
    src, dst, source = "cp/src.bin", "cp/dst.bin", "reports/cp/src.bin"
    c.put_object(
        Bucket="reports", Key=src, Body=body, ContentType="text/x-src", Metadata={"fence-token": "4.1", "origin": "src"}
    )
    # The source's x-amz-meta-fence-token is its writer's, not a token.
    refused(lambda: c.copy_object(Bucket="reports", Key=dst, CopySource=source), "MissingFenceToken", 428)
    absent(c, dst)
    out = client(fence="4.2").copy_object(Bucket="reports", Key=dst, CopySource=source)
    assert out["CopyObjectResult"]["ETag"] == etag, out
    got = c.get_object(Bucket="reports", Key=dst)
    assert got["Body"].read() == body and got["ContentType"] == "text/x-src", got
    # COPY: the source's metadata, the copier's token.
    assert got["Metadata"] == {"fence-token": "4.2", "origin": "src"} and got["VersionId"] == out["VersionId"], got
    # A newer writer of the destination: the older copier is stale.
    c.put_object(Bucket="reports", Key=dst, Body=b"newer", Metadata={"fence-token": "5.1"})
    refused(lambda: client(fence="4.3").copy_object(Bucket="reports", Key=dst, CopySource=source), "StaleFence", 409)
    assert c.get_object(Bucket="reports", Key=dst)["Body"].read() == b"newer"
    # REPLACE: the token and the Content-Type from the request.
    c.copy_object(
        Bucket="reports", Key=dst, CopySource=source, MetadataDirective="REPLACE",
        Metadata={"fence-token": "5.2"}, ContentType="text/x-new",
    )
    got = c.get_object(Bucket="reports", Key=dst)
    assert got["Body"].read() == body and got["ContentType"] == "text/x-new", got
    assert got["Metadata"] == {"fence-token": "5.2"}, got
    # The source's conditions fail with 412 and change nothing.
    fenced = client(fence="5.3")
    for cond in ({"CopySourceIfMatch": '"0000"'}, {"CopySourceIfNoneMatch": etag},
                 {"CopySourceIfModifiedSince": datetime.datetime(2100, 1, 1)},
                 {"CopySourceIfUnmodifiedSince": datetime.datetime(2000, 1, 1)}):
        refused(lambda: fenced.copy_object(Bucket="reports", Key=dst, CopySource=source, **cond),
                "PreconditionFailed", 412)
    assert c.head_object(Bucket="reports", Key=dst)["Metadata"]["fence-token"] == "5.2"
    fenced.copy_object(Bucket="reports", Key=dst, CopySource=source, CopySourceIfMatch=etag)
    # S3's rules: onto itself only with REPLACE; a missing source; rights.
    refused(lambda: fenced.copy_object(Bucket="reports", Key=src, CopySource=source), "InvalidRequest", 400)
    refused(lambda: fenced.copy_object(Bucket="reports", Key="cp/x", CopySource="reports/cp/none"), "NoSuchKey", 404)
    reader = client(os.environ["READER_KEY"], os.environ["READER_SECRET"], fence="9.1")
    refused(lambda: reader.copy_object(Bucket="reports", Key="cp/r", CopySource=source), "AccessDenied", 403)
    absent(c, "cp/x")
    absent(c, "cp/r")
    # UploadPartCopy: parts that are ranges of another key's object.
    big = os.urandom((6 << 20) + 123)
    c.put_object(Bucket="reports", Key="cp/big.bin", Body=big, Metadata={"fence-token": "4.1"})
    up = c.create_multipart_upload(Bucket="reports", Key="cp/multi.bin", Metadata={"fence-token": "5.4"})
    part = lambda n, r: c.upload_part_copy(  # noqa: E731
        Bucket="reports", Key="cp/multi.bin", UploadId=up["UploadId"], PartNumber=n,
        CopySource="reports/cp/big.bin", CopySourceRange=r,
    )
    refused(lambda: part(1, "bytes=0-%d" % len(big)), "InvalidArgument", 400)
    refused(lambda: part(1, "bytes=-5"), "InvalidArgument", 400)
    first = part(1, "bytes=0-%d" % ((5 << 20) - 1))["CopyPartResult"]["ETag"]
    second = part(2, "bytes=%d-%d" % (5 << 20, len(big) - 1))["CopyPartResult"]["ETag"]
    assert first == '"%s"' % hashlib.md5(big[: 5 << 20]).hexdigest(), first
    c.complete_multipart_upload(
        Bucket="reports", Key="cp/multi.bin", UploadId=up["UploadId"],
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": first}, {"PartNumber": 2, "ETag": second}]},
    )
    assert c.get_object(Bucket="reports", Key="cp/multi.bin")["Body"].read() == big
    # boto3's managed copy: UploadPartCopy above its 8 MiB threshold.
    huge = os.urandom(9 << 20)
    c.put_object(Bucket="reports", Key="cp/huge.bin", Body=huge, Metadata={"fence-token": "4.1"})
    client(fence="5.5").copy({"Bucket": "reports", "Key": "cp/huge.bin"}, "reports", "cp/huge-copy.bin")
    assert c.get_object(Bucket="reports", Key="cp/huge-copy.bin")["Body"].read() == huge


def batch_deletes():
    """DeleteObjects: each key a fenced delete under the request's one
    Fence-Token, decided by that key's mark; refused keys are Errors
    entries (stale, no right, a version named) and the rest are deleted."""
    c = client()
    for k in ("bd/a", "bd/b", "bd/c", "bd/q"):
        c.put_object(Bucket="reports", Key=k, Body=b"x", Metadata={"fence-token": "6.1"})
    c.put_object(Bucket="reports", Key="bd/c", Body=b"newer", Metadata={"fence-token": "8.1"})
    batch = lambda *keys, **kw: {"Objects": [{"Key": k} for k in keys], **kw}  # noqa: E731
    refused(lambda: c.delete_objects(Bucket="reports", Delete=batch("bd/a")), "MissingFenceToken", 428)
    out = client(fence="7.1").delete_objects(
        Bucket="reports",
        Delete={"Objects": [{"Key": "bd/a"}, {"Key": "bd/b"}, {"Key": "bd/c"}, {"Key": "bd/q", "VersionId": "1"}]},
    )
    assert sorted(d["Key"] for d in out["Deleted"]) == ["bd/a", "bd/b"], out
    assert {e["Key"]: e["Code"] for e in out["Errors"]} == {"bd/c": "StaleFence", "bd/q": "NotImplemented"}, out
    absent(c, "bd/a")
    absent(c, "bd/b")
    assert c.get_object(Bucket="reports", Key="bd/c")["Body"].read() == b"newer"
    assert c.get_object(Bucket="reports", Key="bd/q")["Body"].read() == b"x"
    reader = client(os.environ["READER_KEY"], os.environ["READER_SECRET"], fence="9.1")
    out = reader.delete_objects(Bucket="reports", Delete=batch("bd/c"))
    assert [e["Code"] for e in out["Errors"]] == ["AccessDenied"], out
    out = client(fence="7.2").delete_objects(Bucket="reports", Delete=batch("bd/q", Quiet=True))
    assert "Deleted" not in out and "Errors" not in out, out
    absent(c, "bd/q")
    # What boto3's resource API sends for "delete everything under a prefix".
    fenced = boto3.resource(
        "s3", endpoint_url=ENDPOINT, aws_access_key_id=os.environ["S3_KEY"],
        aws_secret_access_key=os.environ["S3_SECRET"], region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    fenced.meta.client.meta.events.register(
        "before-sign.s3.*", lambda request, **_: request.headers.__setitem__("Fence-Token", "9.2")
    )
    fenced.Bucket("reports").objects.filter(Prefix="bd/").delete()
    assert "Contents" not in c.list_objects_v2(Bucket="reports", Prefix="bd/")


def multipart():
    """Multipart with boto3: Complete publishes the parts in order with
    S3's multipart ETag; a Complete whose token went stale while it
    uploaded (a newer writer came) is StaleFence and makes nothing
    visible; bad part lists are refused; Abort ends an upload."""
    a_token, b_token = os.environ["TOKEN_A"], os.environ["TOKEN_B"]
    c = client()
    key = "mp/big.bin"
    parts_data = [os.urandom(5 << 20), os.urandom(1 << 20)]

    def upload(token):
        up = c.create_multipart_upload(Bucket="reports", Key=key, Metadata={"fence-token": token, "kind": "parts"})
        parts = []
        for n, data in enumerate(parts_data, 1):
            r = c.upload_part(Bucket="reports", Key=key, UploadId=up["UploadId"], PartNumber=n, Body=data)
            assert r["ETag"] == '"%s"' % hashlib.md5(data).hexdigest()
            parts.append({"PartNumber": n, "ETag": r["ETag"]})
        return up["UploadId"], parts

    # A begins and uploads; B (newer) writes meanwhile; A's Complete is stale.
    a_upload, a_parts = upload(a_token)
    c.put_object(Bucket="reports", Key=key, Body=b"from-b", Metadata={"fence-token": b_token})
    done = lambda: c.complete_multipart_upload(
        Bucket="reports", Key=key, UploadId=a_upload, MultipartUpload={"Parts": a_parts}
    )
    refused(done, "StaleFence", 409)
    assert c.get_object(Bucket="reports", Key=key)["Body"].read() == b"from-b"
    c.abort_multipart_upload(Bucket="reports", Key=key, UploadId=a_upload)
    refused(done, "NoSuchUpload", 404)

    # A newer token: the parts, checked, then published as one object.
    c_token = os.environ["TOKEN_C"]
    upload_id, parts = upload(c_token)
    refused(
        lambda: c.complete_multipart_upload(
            Bucket="reports", Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts[::-1]}
        ),
        "InvalidPartOrder",
        400,
    )
    wrong = [dict(parts[0]), dict(parts[1], ETag='"%s"' % ("0" * 32))]
    refused(
        lambda: c.complete_multipart_upload(
            Bucket="reports", Key=key, UploadId=upload_id, MultipartUpload={"Parts": wrong}
        ),
        "InvalidPart",
        400,
    )
    out = c.complete_multipart_upload(
        Bucket="reports", Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    md5s = b"".join(hashlib.md5(d).digest() for d in parts_data)
    assert out["ETag"] == '"%s-2"' % hashlib.md5(md5s).hexdigest(), out["ETag"]
    # KEEPALIVE=1: the gateway answered at once and sent whitespace until
    # the result (--complete-keepalive-from), a streamed answer.
    headers = out["ResponseMetadata"]["HTTPHeaders"]
    streamed = headers.get("transfer-encoding") == "chunked" and "content-length" not in headers
    assert streamed == (os.environ.get("KEEPALIVE") == "1"), headers
    got = c.get_object(Bucket="reports", Key=key)
    assert got["Body"].read() == b"".join(parts_data)
    assert got["ETag"] == out["ETag"] and got["Metadata"] == {"fence-token": c_token, "kind": "parts"}, got
    # The same Complete again (an SDK retrying after a lost answer): the
    # answer it had, not NoSuchUpload; nothing is published twice.
    again = c.complete_multipart_upload(
        Bucket="reports", Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    assert again["ETag"] == out["ETag"] and again["VersionId"] == got["VersionId"], (again, got)
    assert c.head_object(Bucket="reports", Key=key)["VersionId"] == got["VersionId"]
    refused(lambda: c.upload_part(Bucket="reports", Key=key, UploadId=upload_id, PartNumber=3, Body=b"x"),
            "NoSuchUpload", 404)


def parse_token(text):
    epoch, counter = text.rsplit(":", 1)[-1].split(".")
    return int(epoch), int(counter)


def history():
    """Concurrent writers of one key, each PUT with a random token; the
    history must hold the fence: in version order the applied tokens rise
    strictly, every StaleFence names a highest at least the presented
    token, and the key ends with the last applied write."""
    import random
    import threading

    threads, writes = 8, 25
    key = "history/k"
    log, lock = [], threading.Lock()

    def writer(n):
        c = client()
        rng = random.Random(n)
        for i in range(writes):
            token = f"1.{rng.randrange(1, 400)}"
            body = f"{n}-{i}-{token}".encode()
            try:
                r = c.put_object(Bucket="reports", Key=key, Body=body, Metadata={"fence-token": token})
                entry = ("applied", token, int(r["VersionId"]), body)
            except botocore.exceptions.ClientError as e:
                code = e.response["Error"]["Code"]
                assert code == "StaleFence", e.response["Error"]
                highest = e.response["ResponseMetadata"]["HTTPHeaders"]["fence-token-highest"]
                entry = ("stale", token, highest, body)
            with lock:
                log.append(entry)

    pool = [threading.Thread(target=writer, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert len(log) == threads * writes, len(log)
    applied = sorted((e for e in log if e[0] == "applied"), key=lambda e: e[2])
    assert applied, "nothing applied"
    for before, after in zip(applied, applied[1:]):
        assert after[2] > before[2], ("a version twice", before, after)
        assert parse_token(after[1]) > parse_token(before[1]), ("a token went back", before, after)
    for e in log:
        if e[0] == "stale":
            assert parse_token(e[2]) >= parse_token(e[1]), ("stale under a lower highest", e)
    last = applied[-1]
    got = client().get_object(Bucket="reports", Key=key)
    assert got["Body"].read() == last[3] and got["VersionId"] == str(last[2])
    print(f"history: {len(applied)} applied, {len(log) - len(applied)} stale")


def upload_bounded():
    """An upload under --max-upload 12 MiB: part 1 sent three times (a
    client retrying: only the last counts and is kept), part 2; a third
    5 MiB part would pass 12 MiB and is EntityTooLarge, a 2 MiB one fits.
    The upload is left for `complete_saved` (written to $STATE)."""
    c = client()
    key = "bounded/big.bin"
    up = c.create_multipart_upload(Bucket="reports", Key=key, Metadata={"fence-token": "7.1"})
    part = lambda n, body: c.upload_part(  # noqa: E731
        Bucket="reports", Key=key, UploadId=up["UploadId"], PartNumber=n, Body=body
    )
    for _ in range(3):
        first = part(1, os.urandom(5 << 20))
    second = part(2, os.urandom(5 << 20))
    refused(lambda: part(3, os.urandom(5 << 20)), "EntityTooLarge", 400)
    third = part(3, os.urandom(2 << 20))
    parts = [{"PartNumber": n, "ETag": r["ETag"]} for n, r in ((1, first), (2, second), (3, third))]
    with open(os.environ["STATE"], "w") as f:
        json.dump({"Key": key, "UploadId": up["UploadId"], "Parts": parts}, f)


def complete_saved():
    """Complete the upload `upload_bounded` saved; $EXPECT is "ok" (the
    object is then 12 MiB) or an S3 error code (then nothing is visible)."""
    c = client()
    with open(os.environ["STATE"]) as f:
        saved = json.load(f)
    done = lambda: c.complete_multipart_upload(  # noqa: E731
        Bucket="reports", Key=saved["Key"], UploadId=saved["UploadId"], MultipartUpload={"Parts": saved["Parts"]}
    )
    if os.environ["EXPECT"] == "ok":
        out = done()
        head = c.head_object(Bucket="reports", Key=saved["Key"])
        assert head["ContentLength"] == saved.get("Length", 12 << 20), head
        if "ETag" in saved:
            assert out["ETag"] == saved["ETag"] and head["ETag"] == saved["ETag"], (out, head)
    else:
        refused(done, os.environ["EXPECT"], int(os.environ.get("EXPECT_STATUS", "400")))
        absent(c, saved["Key"])


def upload_sized():
    """Begin an upload of key $KEY and store parts of the sizes in $SIZES
    (bytes, comma-separated), random bytes; save what `complete_saved`
    needs and what the object must then be (length, S3's multipart ETag,
    SHA-256 of the whole) to $STATE."""
    c = client()
    key = os.environ["KEY"]
    up = c.create_multipart_upload(Bucket="reports", Key=key, Metadata={"fence-token": "7.1"})
    parts, md5s, whole = [], b"", hashlib.sha256()
    for n, size in enumerate((int(s) for s in os.environ["SIZES"].split(",")), 1):
        body = os.urandom(size)
        r = c.upload_part(Bucket="reports", Key=key, UploadId=up["UploadId"], PartNumber=n, Body=body)
        assert r["ETag"] == '"%s"' % hashlib.md5(body).hexdigest(), r
        parts.append({"PartNumber": n, "ETag": r["ETag"]})
        md5s += hashlib.md5(body).digest()
        whole.update(body)
    saved = {
        "Key": key,
        "UploadId": up["UploadId"],
        "Parts": parts,
        "Length": sum(int(s) for s in os.environ["SIZES"].split(",")),
        "ETag": '"%s-%d"' % (hashlib.md5(md5s).hexdigest(), len(parts)),
        "Sha256": whole.hexdigest(),
    }
    with open(os.environ["STATE"], "w") as f:
        json.dump(saved, f)


def upload_listings():
    """ListParts and ListMultipartUploads: the parts stored so far (a part
    sent again listed once, as its last upload), in pages by marker and
    through boto3's paginator; the uploads in progress by key and then by
    start, with a prefix, a delimiter and markers, per bucket; Complete and
    Abort take an upload off the list; a reader may list neither; an
    UploadId of another key, or none, is NoSuchUpload. Two uploads are
    left for the test (rclone's cleanup)."""
    c = client()
    key = "pending/a.bin"
    begin = lambda k, bucket="reports": c.create_multipart_upload(  # noqa: E731
        Bucket=bucket, Key=k, Metadata={"fence-token": "7.1"}
    )["UploadId"]
    uid = begin(key)
    part = lambda n, body: c.upload_part(  # noqa: E731
        Bucket="reports", Key=key, UploadId=uid, PartNumber=n, Body=body
    )["ETag"]
    part(2, b"the first try of part 2")
    bodies = {1: os.urandom(5 << 20), 2: b"second", 3: b"third"}
    etags = {n: part(n, body) for n, body in bodies.items()}
    listed = c.list_parts(Bucket="reports", Key=key, UploadId=uid)
    got = [(p["PartNumber"], p["ETag"], p["Size"]) for p in listed["Parts"]]
    assert got == [(n, etags[n], len(b)) for n, b in sorted(bodies.items())], got
    assert listed["IsTruncated"] is False, listed
    now = datetime.datetime.now(datetime.timezone.utc)
    assert all(abs((p["LastModified"] - now).total_seconds()) < 300 for p in listed["Parts"]), listed
    page = c.list_parts(Bucket="reports", Key=key, UploadId=uid, MaxParts=2)
    assert [p["PartNumber"] for p in page["Parts"]] == [1, 2], page
    assert page["IsTruncated"] is True and page["NextPartNumberMarker"] == 2, page
    rest = c.list_parts(Bucket="reports", Key=key, UploadId=uid, PartNumberMarker=2)
    assert [p["PartNumber"] for p in rest["Parts"]] == [3] and rest["IsTruncated"] is False, rest
    pages = c.get_paginator("list_parts").paginate(
        Bucket="reports", Key=key, UploadId=uid, PaginationConfig={"PageSize": 1}
    )
    assert [p["PartNumber"] for pg in pages for p in pg.get("Parts", [])] == [1, 2, 3]

    # More uploads: a second of the same key, one under a deeper prefix,
    # one beside, one outside the prefix, one in the other bucket.
    second = begin(key)
    deep = begin("pending/dir/b.bin")
    beside = begin("pending/c.bin")
    begin("zzz/outside.bin")
    elsewhere = begin("pending/x.bin", bucket="other")
    everything = [(key, uid), (key, second), ("pending/c.bin", beside), ("pending/dir/b.bin", deep)]
    uploads = lambda **kw: c.list_multipart_uploads(Bucket="reports", Prefix="pending/", **kw)  # noqa: E731
    pairs = lambda out: [(u["Key"], u["UploadId"]) for u in out.get("Uploads", [])]  # noqa: E731
    out = uploads()
    assert pairs(out) == everything and out["IsTruncated"] is False, out
    assert all(abs((u["Initiated"] - now).total_seconds()) < 300 for u in out["Uploads"]), out
    rolled = uploads(Delimiter="/")
    assert pairs(rolled) == everything[:3], rolled
    assert rolled["CommonPrefixes"] == [{"Prefix": "pending/dir/"}], rolled
    pages = list(
        c.get_paginator("list_multipart_uploads").paginate(
            Bucket="reports", Prefix="pending/", PaginationConfig={"PageSize": 1}
        )
    )
    assert [pr for pg in pages for pr in pairs(pg)] == everything and len(pages) == 4, pages
    first = uploads(MaxUploads=1)
    assert first["IsTruncated"] is True, first
    assert (first["NextKeyMarker"], first["NextUploadIdMarker"]) == (key, uid), first
    pages = list(
        c.get_paginator("list_multipart_uploads").paginate(
            Bucket="reports", Prefix="pending/", Delimiter="/", PaginationConfig={"PageSize": 1}
        )
    )
    assert [pr for pg in pages for pr in pairs(pg)] == everything[:3], pages
    assert [cp["Prefix"] for pg in pages for cp in pg.get("CommonPrefixes", [])] == ["pending/dir/"], pages
    # A key marker alone skips every upload of that key; with an UploadId
    # marker, the key's uploads up to it.
    assert pairs(uploads(KeyMarker=key)) == everything[2:]
    assert pairs(uploads(KeyMarker=key, UploadIdMarker=uid)) == everything[1:]
    refused(lambda: uploads(KeyMarker=key, UploadIdMarker="x"), "InvalidArgument", 400)
    assert pairs(c.list_multipart_uploads(Bucket="other")) == [("pending/x.bin", elsewhere)]

    # Parts 1 and 3 published (a part list need not be contiguous); the
    # second upload aborted: both off the list.
    c.complete_multipart_upload(
        Bucket="reports",
        Key=key,
        UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": etags[n]} for n in (1, 3)]},
    )
    c.abort_multipart_upload(Bucket="reports", Key=key, UploadId=second)
    assert pairs(uploads()) == everything[2:]
    refused(lambda: c.list_parts(Bucket="reports", Key=key, UploadId=uid), "NoSuchUpload", 404)
    refused(lambda: c.list_parts(Bucket="reports", Key=key, UploadId=beside), "NoSuchUpload", 404)
    refused(lambda: c.list_parts(Bucket="reports", Key=key, UploadId="nonsense"), "NoSuchUpload", 404)
    r = client(os.environ["READER_KEY"], os.environ["READER_SECRET"])
    refused(lambda: r.list_multipart_uploads(Bucket="reports", Prefix="pending/"), "AccessDenied", 403)
    refused(lambda: r.list_parts(Bucket="reports", Key="pending/c.bin", UploadId=beside), "AccessDenied", 403)


def no_uploads_left():
    """No upload in progress is listed under $PREFIX of bucket reports."""
    c = client()
    out = c.list_multipart_uploads(Bucket="reports", Prefix=os.environ["PREFIX"])
    assert out.get("Uploads", []) == [], out


def begin_only():
    """Begin an upload and store two parts, never completing it (the test
    then kills the gateway)."""
    c = client()
    up = c.create_multipart_upload(Bucket="reports", Key="killed/big.bin", Metadata={"fence-token": "7.1"})
    for n in (1, 2):
        c.upload_part(
            Bucket="reports", Key="killed/big.bin", UploadId=up["UploadId"], PartNumber=n, Body=os.urandom(1 << 20)
        )


if __name__ == "__main__":
    globals()[sys.argv[1]]()
    print("ok", sys.argv[1])
