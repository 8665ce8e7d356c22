#!/usr/bin/env bash
# The gateway's S3 front is tested with the clients people use
# (host/gateway/tests/s3.rs): boto3 and aws-cli from PyPI, pinned to one
# botocore; minio-py (it refuses an error body that is not typed
# application/xml, so it checks the S3 front's Content-Type); rclone and
# s3cmd (which cannot send a token on a delete: docs/gateway.md) from Debian.
set -euo pipefail
python3 -m pip install --disable-pip-version-check --root-user-action=ignore -q \
    "boto3==1.43.11" "botocore==1.43.11" "awscli==1.45.11" "s3transfer==0.17.0" \
    "minio==7.2.20"
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends rclone s3cmd
# sed reads the whole output: `head` would close the pipe early and, under
# pipefail, the SIGPIPE of a chatty version command fails the install (exit 141).
rclone version | sed -n 1p
s3cmd --version
aws --version
