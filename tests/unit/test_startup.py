"""What a start does with a data dir's record of its upstream (startup.plan_data_dir): a
table of every case. No plan ever drops an unflushed write; the refusals say in one line
what is there, for which upstream, and how to flush it."""

from __future__ import annotations

import pytest

from gateway.startup import DataDirPlan, plan_data_dir
from gateway.store.datadir import DataDirError
from gateway.store.origin import DEMO, Contents, Forgotten

U, V = "https://s3.us-east-1.amazonaws.com", "http://minio.local:9000"


def contents(
    upstream: str | None, *, unflushed: int = 0, uploads: int = 0, cached: bool = False
) -> Contents:
    return Contents(upstream, unflushed, unflushed * 1024, uploads, uploads * 2048, cached, ())


EMPTY_UNRECORDED = contents(None)
# (what the journal holds, this start's upstream, the old demo's mark, adopt) -> plan:
# (is_recorded, renews)
CASES = [
    ("fresh dir, real", EMPTY_UNRECORDED, U, False, False, (True, False)),
    ("fresh dir, demo", EMPTY_UNRECORDED, DEMO, False, False, (True, True)),
    ("same real upstream", contents(U, unflushed=3, cached=True), U, False, False, (False, False)),
    ("demo again, pending kept", contents(DEMO, unflushed=3, cached=True), DEMO, False, False,
     (True, True)),
    ("demo again, empty", contents(DEMO), DEMO, False, False, (True, True)),
    ("real -> other real, all flushed", contents(U, cached=True), V, False, False, (True, True)),
    ("demo -> real, all flushed", contents(DEMO, cached=True), U, False, False, (True, True)),
    ("real -> demo, all flushed", contents(U, cached=True), DEMO, False, False, (True, True)),
    ("older version's real dir, real start", contents(None, unflushed=2, cached=True), U, False,
     False, (True, False)),
    ("older version's demo dir, all flushed", contents(None, cached=True), U, True, False,
     (True, True)),
    ("older version's demo dir, adopted", contents(None, unflushed=1), U, True, True,
     (True, True)),
    ("real -> other real, adopted", contents(U, unflushed=1), V, False, True, (True, True)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("found", "upstream", "mark", "adopt", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_plans(
    found: Contents, upstream: str, mark: bool, adopt: bool, expected: tuple[bool, bool]
) -> None:
    plan = plan_data_dir(found, upstream, has_demo_mark=mark, adopt=adopt)
    assert (plan.is_recorded, plan.renews) == expected
    assert (plan.previous, plan.upstream) == (found.upstream, upstream)


REFUSALS = [
    ("real -> demo", contents(U, unflushed=4), DEMO, False, False,
     f"it holds 4 objects (4.0 KiB) acknowledged for {U} and not flushed there yet: start it "
     f"with --upstream-endpoint {U} and that upstream's credentials to flush them, or give "
     "the demo another --data-dir"),
    ("real -> other real", contents(U, unflushed=1, uploads=1), V, False, False,
     f"it holds 1 objects (1.0 KiB) and 1 multipart uploads in progress (2.0 KiB of parts) "
     f"acknowledged for {U} and not flushed there yet: start it with --upstream-endpoint {U} "
     "and that upstream's credentials to flush them, or give this gateway another --data-dir "
     f"(or --adopt-data-dir true to send them to {V})"),
    ("demo -> real, even adopted", contents(DEMO, unflushed=2), U, False, True,
     f"it holds 2 objects (2.0 KiB) acknowledged for the embedded demo upstream and not "
     f"flushed yet; they never go to {U}: start the demo on it (no --upstream-endpoint) to "
     "flush them into its new in-memory upstream, or give this gateway another --data-dir"),
    ("older version's dir, demo start", contents(None, uploads=1), DEMO, False, False,
     "it holds 0 objects (0 B) and 1 multipart uploads in progress (2.0 KiB of parts) not "
     "flushed yet, written by an older version that did not record for which upstream: start "
     "it with --upstream-endpoint of the upstream they were written for and --adopt-data-dir "
     "true to flush them there, or give the demo another --data-dir"),
    ("older version's demo dir, real start", contents(None, unflushed=1), U, True, False,
     "it holds 1 objects (1.0 KiB) not flushed yet, written by an older version that did not "
     "record for which upstream (a demo data dir then): start it with --upstream-endpoint of "
     "the upstream they were written for and --adopt-data-dir true to flush them there, or "
     "give this gateway another --data-dir"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("found", "upstream", "mark", "adopt", "message"),
    [case[1:] for case in REFUSALS],
    ids=[case[0] for case in REFUSALS],
)
def test_refusals(found: Contents, upstream: str, mark: bool, adopt: bool, message: str) -> None:
    with pytest.raises(DataDirError) as refused:
        plan_data_dir(found, upstream, has_demo_mark=mark, adopt=adopt)
    assert str(refused.value) == message


def test_what_the_operator_is_told() -> None:
    adopted = plan_data_dir(
        contents(U, unflushed=2, cached=True), V, has_demo_mark=False, adopt=True
    )
    assert adopted.lines(Forgotten(5, 5 << 20, 1, 2)) == [
        f"--adopt-data-dir true: 2 objects (2.0 KiB), acknowledged for {U}, flush to {V} instead",
        f"dropped 5 cached copies (5.0 MiB) of objects in {U}: {V} does not hold them",
        f"2 multipart uploads this gateway opened in {U} and a crash left open were not "
        "aborted there: abort them (aws s3api list-multipart-uploads, abort-multipart-upload) "
        "or let a lifecycle rule do it",
    ]
    demo = DataDirPlan(True, True, DEMO, DEMO)
    assert demo.lines(Forgotten(1, 7, 0, 3)) == [
        "dropped 1 cached copies (7 B) of objects flushed to the previous demo upstream: it "
        "lived in memory, and they are gone with it"
    ]
