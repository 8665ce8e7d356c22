"""The seed's paused report writer through redis-py: prints one line per
step, the same lines paused_writer.mjs prints through ioredis.

Usage: python3 paused_writer.py PORT (a server loading the module with
TEST-CLOCK, so the lease clock is the script's).
"""

import sys

import redis


def show(reply):
    if reply is True:  # redis-py's reading of +OK
        return "OK"
    if isinstance(reply, list):
        return " ".join(show(x) for x in reply)
    if isinstance(reply, bytes):
        return reply.decode()
    return str(reply)


def step(r, label, *args):
    try:
        out = show(r.execute_command(*args))
    except redis.exceptions.ResponseError as e:
        out = str(e)
    print(f"{label}: {out}")


def main():
    r = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]))
    # A fixed lineage so the tokens print the same every run; a real
    # server makes a random one at its first acquire.
    step(r, "lineage", "SET", "fencecheck:lineage", "7")
    step(r, "A acquires", "FENCE.ACQUIRE", "report/july", "a7", "30000", "NOW", "1000")
    step(r, "A stages", "SET", "reports/july/a7.tmp", "A's render")
    # A pauses past its lease; B acquires after it expired.
    step(r, "B acquires", "FENCE.ACQUIRE", "report/july", "b9", "30000", "NOW", "40000")
    step(r, "B stages", "SET", "reports/july/b9.tmp", "B's render")
    step(r, "B publishes", "FENCE.SET", "report/july", "7:0.2", "reports/july/b9.tmp")
    # A resumes and publishes with its old token.
    step(r, "A publishes", "FENCE.SET", "report/july", "7:0.1", "reports/july/a7.tmp")
    step(r, "visible", "GET", "report/july")
    step(r, "A renews", "FENCE.RENEW", "report/july", "a7", "7:0.1", "30000", "NOW", "41000")
    step(r, "A releases", "FENCE.RELEASE", "report/july", "a7", "7:0.1")
    step(r, "A discards", "DEL", "reports/july/a7.tmp")
    step(r, "B releases", "FENCE.RELEASE", "report/july", "b9", "7:0.2")


main()
