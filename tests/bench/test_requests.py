"""Load generators' requests: the message contract's encoding, an id filled in per send."""

from __future__ import annotations

from edgeinfer.messages import parse_request
from edgeinfer_bench.requests import ID_SLOT, request_templates, with_id


def test_templates_parse_as_the_requests_they_stand_for() -> None:
    templates = request_templates([b"\xff\xd8\xffone", b"\xff\xd8\xfftwo"], top_k=1, deadline_ms=100.0)
    assert [parse_request(t).id for t in templates] == [ID_SLOT, ID_SLOT]
    request = parse_request(with_id(templates[1], "r-7"))
    assert (request.id, request.image, request.top_k, request.deadline_ms) == (
        "r-7",
        b"\xff\xd8\xfftwo",
        1,
        100.0,
    )


def test_only_the_id_is_replaced() -> None:
    template = request_templates([ID_SLOT.encode()])[0]  # an "image" whose bytes spell the slot
    assert parse_request(with_id(template, "x")).image == ID_SLOT.encode()
