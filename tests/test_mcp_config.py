"""The startsafe-mcp configuration: the design's file loads, and a wrong one is refused at
start with the file, the line and what is wrong (integrations.md, section 3)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from startsafe_client.mcp.config import ConfigError, Template, load_config
from startsafe_client.mcp.toml_lines import key_lines

from startsafe_client import KeyRefused, effect

DESIGN = """\
[startsafe]
url = "http://127.0.0.1:8000"      # or STARTSAFE_URL
token_env = "STARTSAFE_TOKEN"      # the variable that holds the agent token
run_key = "ticket-4812"
supersede = "stale"
approval_timeout = 300

[servers.mail]
command = ["python", "mail_server.py"]
env = { MAILBOX = "work" }
trust_annotations = true
# url = "http://127.0.0.1:9000/mcp"

[servers.crm]
url = "http://127.0.0.1:9001/mcp"

[tools."mail.send_reply"]
kind = "effect"
key = "outlook:message:{message_id}"
key_source = "provider"
reconcile = "mail.find_reply"
preview = "Reply to {to}: {subject}"

[tools."crm.send_campaign"]
kind = "effect"
key = "campaign:{campaign_id}"
key_source = "intent"
needs_approval = true
approvals_required = 2
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "startsafe-mcp.toml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def refusal(tmp_path: Path, text: str) -> list[str]:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    return str(refused.value).splitlines()


def test_the_design_s_configuration_loads_with_its_defaults(tmp_path):
    config = load_config(write(tmp_path, DESIGN))

    assert config.startsafe.run_key == "ticket-4812"
    assert config.startsafe.supersede == "stale"
    assert config.startsafe.heartbeat_timeout == 60  # the API's default
    assert config.servers["mail"].env == {"MAILBOX": "work"}
    assert config.servers["mail"].trust_annotations is True
    assert config.servers["crm"].trust_annotations is False  # annotations are hints
    assert config.cwd_of("mail") == tmp_path  # stdio servers start in the file's folder
    reply = config.tools["mail.send_reply"]
    assert (reply.key_source, reply.reconcile) == ("provider", "mail.find_reply")
    assert config.tools["crm.send_campaign"].approvals_required == 2


def test_a_toml_syntax_error_names_its_line(tmp_path):
    lines = refusal(tmp_path, '[startsafe]\nurl = "http://x\n')

    assert lines == [f"{tmp_path / 'startsafe-mcp.toml'}:2: Illegal character '\\n' (column 16)"]


@pytest.mark.parametrize(
    ("replace", "by", "line", "what"),
    [
        ('supersede = "stale"', 'supersede = "yes"', 5, "startsafe.supersede: must be true, false"),
        ("approval_timeout = 300", 'approval_timeout = "300"', 6, "valid number"),
        ("trust_annotations = true", "trust = true", 11, "servers.mail.trust: unknown key"),
        ('url = "http://127.0.0.1:9001/mcp"', 'url = "ftp://x"', 15, "http:// or https://"),
        ('key_source = "provider"', 'key_source = "llm"', 20, "key_source: Input should be"),
        ('"outlook:message:{message_id}"', '"outlook:{message_id!r}"', 19, "names one argument"),
        ('"outlook:message:{message_id}"', '"outlook:message"', 19, "same for every call"),
        ('key_source = "provider"\n', "", 19, 'key: a key needs key_source ("provider"'),
        ('reconcile = "mail.find_reply"', 'reconcile = "find_reply"', 21, "SERVER.TOOL"),
        ("needs_approval = true\n", "", 28, "approvals_required: needs needs_approval = true"),
        (
            '[tools."crm.send_campaign"]',
            '[tools."billing.send_campaign"]',
            24,
            "no [servers.billing]",
        ),
        ('[tools."crm.send_campaign"]', '[tools."send_campaign"]', 24, "as SERVER.TOOL"),
        ('command = ["python", "mail_server.py"]', "", 8, "the server's command or its url"),
        ('# url = "http', 'url = "http', 8, "a command or a url, not both"),
    ],
)
def test_a_wrong_key_is_refused_with_its_line_and_what_is_wrong(tmp_path, replace, by, line, what):
    assert replace in DESIGN
    lines = refusal(tmp_path, DESIGN.replace(replace, by, 1))

    found = [text for text in lines if f"startsafe-mcp.toml:{line}: " in text and what in text]
    assert found, lines


def test_a_read_takes_no_key_and_is_never_gated(tmp_path):
    text = (
        DESIGN
        + '\n[tools."mail.find_reply"]\nkind = "read"\nkey = "x:{a}"\nneeds_approval = true\n'
    )
    lines = refusal(tmp_path, text)

    assert any(":33: " in t and 'find_reply".key: a read takes none' in t for t in lines), lines
    assert any(":34: " in t and "needs_approval: a read is never gated" in t for t in lines), lines


def test_every_problem_found_is_listed_at_once(tmp_path):
    text = DESIGN.replace('supersede = "stale"', "supersede = 1").replace(
        "approval_timeout = 300", "approval_timeout = -1"
    )
    lines = refusal(tmp_path, text)

    assert [line.split(": ")[0].rsplit(":", 1)[1] for line in lines] == ["5", "6"]


def test_key_lines_reads_keys_as_tomllib_does():
    text = textwrap.dedent(
        """\
        top = 1
        [servers."a.b"]  # a quoted name with a dot
        command = [
          "python",   # not a key = here
          "x = y",
        ]
        text = \"\"\"
        fake = 1
        \"\"\"
        env = { A = "b", C = "d" }
        nested.deep = 2
        [[list]]
        item = 'it''s'
        """
    )

    lines = key_lines(text)

    assert lines == {
        ("top",): 1,
        ("servers", "a.b"): 2,
        ("servers", "a.b", "command"): 3,
        ("servers", "a.b", "text"): 7,
        ("servers", "a.b", "env"): 10,
        ("servers", "a.b", "nested", "deep"): 11,
        ("list",): 12,
        ("list", "item"): 13,
    }


def test_a_key_template_never_builds_a_key_from_nothing():
    template = Template.parse("outlook:message:{message_id}")

    assert template.key({"message_id": "<m1@x>", "body": "any"}, "provider").value == (
        "outlook:message:<m1@x>"
    )
    assert template.key({"message_id": 42}, "provider").value == "outlook:message:42"
    for missing in ({}, {"message_id": None}, {"message_id": "  "}, {"message_id": True}):
        spec = effect(key=lambda args: template.key(args, "provider"))
        with pytest.raises(KeyRefused):  # the protocol core's refusal: nothing is recorded
            spec.key_for("mail.send_reply", missing)


def test_a_preview_shows_a_missing_field_as_a_question_mark():
    preview = Template.parse("Reply to {to}: {subject} {{literally}}")

    assert preview.preview({"to": "ana", "subject": "Hi"}) == "Reply to ana: Hi {literally}"
    assert preview.preview({"to": "ana"}) == "Reply to ana: ? {literally}"


def test_the_command_refuses_a_bad_file_with_exit_2(tmp_path):
    path = write(tmp_path, DESIGN.replace("approval_timeout = 300", "approval_timeout = 0"))
    command = Path(sys.executable).parent / "startsafe-mcp"

    done = subprocess.run(
        [str(command), "--config", str(path)], capture_output=True, text=True, timeout=60
    )

    assert done.returncode == 2
    assert f"{path}:6: startsafe.approval_timeout: Input should be greater than 0" in done.stderr
