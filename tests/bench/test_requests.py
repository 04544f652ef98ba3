"""Load generators' requests: the message contract's encoding, an id (and `sent_at`) filled in per send."""

from __future__ import annotations

import pytest

from edgeinfer.errors import EdgeinferError
from edgeinfer.messages import Request, parse_request
from edgeinfer_bench.requests import ID_SLOT, Template, request_templates, timed_templates, with_id


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


def test_a_template_sends_the_contracts_request_with_its_id_and_sent_at() -> None:
    (part,) = timed_templates([b"\xff\xd8not really a jpeg"], deadline_ms=100.0)
    request = parse_request(part.body("r100-7", 1_800_000_000.25))
    assert isinstance(request, Request)
    assert request.id == "r100-7"
    assert request.image == b"\xff\xd8not really a jpeg"
    assert request.deadline_ms == 100.0
    assert request.sent_at == pytest.approx(1_800_000_000.25, abs=1e-3)
    with pytest.raises(EdgeinferError):
        Template.from_request(b'{"id": "no slots"}')
