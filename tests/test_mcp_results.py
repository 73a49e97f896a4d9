"""What startsafe-mcp records as an effect's result, and what a replay answers from it."""

from __future__ import annotations

import mcp_types as types
from startsafe_client.mcp.proxy import MAX_RECORDED, _recorded, _replayed


def test_a_replay_answers_the_content_and_structured_content_that_were_recorded():
    result = types.CallToolResult(
        content=[types.TextContent(text="sent")], structured_content={"id": "r-1"}
    )

    recorded = _recorded(result)

    assert recorded == {
        "content": [{"type": "text", "text": "sent"}],
        "structuredContent": {"id": "r-1"},
    }
    replayed = _replayed(recorded)
    assert (replayed.content, replayed.structured_content, replayed.is_error) == (
        result.content,
        {"id": "r-1"},
        False,
    )


def test_a_result_too_large_to_record_is_recorded_as_the_start_of_its_text():
    text = "x" * (MAX_RECORDED + 10)
    result = types.CallToolResult(content=[types.TextContent(text=text)])

    recorded = _recorded(result)

    (block,) = recorded["content"]
    assert block["text"].startswith("(done; its result of ")
    assert block["text"].endswith("x" * 2000)
    assert len(str(recorded)) < 3000  # within the API's limit


def test_a_result_an_operator_recorded_is_answered_as_already_done():
    replayed = _replayed({"note": "found in the sent items"})  # mark done, with a result

    assert replayed.content[0].text == 'already done: {"note": "found in the sent items"}'
    assert replayed.structured_content == {"note": "found in the sent items"}
    assert _replayed({}).content[0].text == "already done"
