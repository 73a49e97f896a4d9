"""The client package on its own: ``httpx`` is its only requirement, and importing it
imports neither Django nor any agent framework (the framework adapters are extras).
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "startsafe_client"

# What an agent framework or the server would bring in; none may come with the client.
NOT_IMPORTED = (
    "django",
    "agents",  # the OpenAI Agents SDK
    "openai",
    "langchain",
    "langchain_core",
    "langgraph",
    "pydantic_ai",
    "pydantic",
    "mcp",
)


def test_httpx_is_the_only_requirement_of_the_client_package():
    declared = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    installed = importlib.metadata.requires("startsafe-client") or []

    assert declared["dependencies"] == ["httpx>=0.27,<1"]
    # Extras (the framework adapters) are optional: only unconditional requirements count.
    assert [r for r in installed if "extra ==" not in r] == ["httpx<1,>=0.27"]


def test_importing_the_client_imports_no_framework_and_no_django():
    code = (
        "import sys, startsafe_client; "
        f"found = [m for m in {NOT_IMPORTED!r} if m in sys.modules]; "
        "assert not found, found; "
        "print(startsafe_client.Client.__name__, startsafe_client.AsyncClient.__name__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Client", "AsyncClient"]


def test_the_repository_folder_gives_the_real_package_from_the_root():
    """From the root, ``startsafe_client/`` (the distribution's folder) is on the path
    first; its ``__init__`` loads the real package in its place (module doc there)."""
    code = (
        "import startsafe_client, startsafe_client.errors as e; "
        "print(startsafe_client.__file__); print(e.__file__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )

    assert done.returncode == 0, done.stderr
    package = CLIENT / "startsafe_client"
    assert done.stdout.split() == [str(package / "__init__.py"), str(package / "errors.py")]


def test_the_openai_agents_extra_brings_the_sdk_that_its_adapter_imports():
    installed = importlib.metadata.requires("startsafe-client") or []
    assert 'openai-agents<0.25,>=0.24; extra == "openai-agents"' in installed

    code = "import sys, startsafe_client.openai_agents; print('agents' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"]


def test_the_mcp_extra_brings_the_sdk_and_the_startsafe_mcp_command():
    installed = importlib.metadata.requires("startsafe-client") or []
    assert 'mcp<3,>=2.3; extra == "mcp"' in installed

    commands = importlib.metadata.entry_points(group="console_scripts", name="startsafe-mcp")
    assert [command.value for command in commands] == ["startsafe_client.mcp.cli:main"]
