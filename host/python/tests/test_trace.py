"""The agreement trace: canonical lines, batches equal single checks, and
malformed sequences stop with an error."""

import io

import pytest

from fencecheck import trace
from fencecheck.vectors import VectorFormatError

SEQ = [
    '{"slot":0,"check":{"scope":"s","token":[0,5]}}',
    '{"slot":0,"check":{"scope":"s","token":[0,4]}}',
    '{"slot":1,"check":{"scope":"é","token":[0,1]}}',
    '{"slot":1,"check":{"scope":"e","token":[0,2]}}',
    '{"slot":0,"damage":"flip-bit","bit":3}',
]


def run(lines, guest):
    out = io.StringIO()
    trace.run(lines, guest, out)
    return out.getvalue().splitlines()


def test_lines_are_canonical(guest):
    """Outcome fields appear in the documented order; scopes print as UTF-8 hex."""
    lines = run(SEQ, guest)
    assert lines[0].startswith('{"line":1,"outcome":"applied","version":1,"highest":[0,0,5],"state":"')
    assert lines[1].startswith('{"line":2,"outcome":"stale-fence","presented":[0,0,4],"highest":[0,0,5],"state":"')
    assert lines[3].startswith('{"line":4,"outcome":"error","error":"scope-mismatch","scope":"c3a9","state":"')
    assert lines[4].startswith('{"line":5,"damage":"flip-bit","state":"')


def test_a_batch_traces_like_single_checks(guest):
    """A batch line prints the same outcomes and states as the same checks one by one."""
    single = run(SEQ[:1] + ['{"slot":0,"check":{"scope":"s","token":[0,6]}}', '{"slot":2,"check":{"scope":"t","token":[0,0]}}'], guest)
    batch = run(SEQ[:1] + ['{"batch":[{"slot":0,"check":{"scope":"s","token":[0,6]}},{"slot":2,"check":{"scope":"t","token":[0,0]}}]}'], guest)
    strip = lambda line: line.split(",", 2)[-1] if '"item"' in line else line.split(",", 1)[-1]  # noqa: E731
    assert [strip(x) for x in batch[1:]] == [strip(x) for x in single[1:]]


def test_batches_trace_the_same_through_packed_and_typed_exports(guest):
    """check_batch (check-packed) and the typed check-batch print the same lines."""
    seq = SEQ + ['{"batch":[{"slot":0,"check":{"scope":"s","token":[0,9]}},{"slot":1,"check":{"scope":"é","token":[0,1]}},'
                 '{"slot":3,"check":{"scope":"","token":[0,1]}}]}']
    packed, typed = io.StringIO(), io.StringIO()
    trace.run(seq, guest, packed)
    trace.run(seq, guest, typed, typed_batches=True)
    assert packed.getvalue() == typed.getvalue() and '"item":2' in packed.getvalue()


@pytest.mark.parametrize(
    "bad",
    [
        '{"slot":0}',
        '{"slot":0,"check":{"scope":"s","token":[0,1]},"damage":"clear"}',
        '{"slot":-1,"check":{"scope":"s","token":[0,1]}}',
        '{"batch":[{"slot":0,"check":{"scope":"s","token":[0,1]}},{"slot":0,"check":{"scope":"s","token":[0,2]}}]}',
        '{"slot":0,"damage":"melt"}',
        '{"slot":0,"check":{"scope":"s","token":[0,1],"keys":[]}}',
        '{"batch":[{"slot":0,"check":{"scope":"s","token":[0,1],"keys":[{"id":1,"secret":"00"}]}}]}',
        "not json",
    ],
)
def test_malformed_lines_stop_the_trace(guest, bad):
    """Every malformed line raises instead of being skipped (a check with
    `keys`, too: a trace has no signed scopes, and check would drop them)."""
    with pytest.raises(VectorFormatError):
        run([bad], guest)
