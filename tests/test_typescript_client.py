"""The TypeScript client (clients/typescript) in ``make test``: its own tests with Node's
test runner against a live server on PostgreSQL, and its package as npm packs it.

``npm ci`` installs its dev dependencies (TypeScript, Node's types, the AI SDK and zod)
from the committed lock file, again only when the lock file changed; ``tsc --noEmit``
checks the package, then it is built and ``node --test`` runs the shared vectors, the unit tests and
the live tests (clients/typescript/test/live.test.ts) with the server's address, an
agent's token and an operator's credentials in the environment. Node 20 or newer and npm
are required: without them these tests fail and say so, they are never skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "clients" / "typescript"
TSC = PACKAGE / "node_modules" / ".bin" / "tsc"
# npm ci's stamp: the digest of the lock file it installed.
INSTALLED = PACKAGE / "node_modules" / ".startsafe-lock.sha256"
# The package's entry points checked from the packed tarball, installed alone
# ("./ai" needs its optional peer, the AI SDK: its files are checked to be packed).
ENTRY_POINTS = {"startsafe-client": ["Client", "effect", "read", "providerKey", "NotPerformed"]}

pytestmark = pytest.mark.node


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 300):
    """Run a command; fail the test with its whole output when it fails."""
    done = subprocess.run(
        command,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        pytest.fail(
            f"{' '.join(command)} exited {done.returncode} in {cwd}\n"
            f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}",
            pytrace=False,
        )
    return done


@pytest.fixture(scope="module")
def built() -> Path:
    """The package installed from its lock file, type-checked and built (src → dist,
    test → dist-test)."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"the TypeScript client's tests need {' and '.join(missing)} (Node.js 20 or newer "
            "with npm) on the PATH",
            pytrace=False,
        )
    version = run(["node", "--version"], PACKAGE).stdout.strip()
    if int(re.match(r"v(\d+)", version).group(1)) < 20:
        pytest.fail(
            f"the TypeScript client needs Node.js 20 or newer, not {version}", pytrace=False
        )
    lock = hashlib.sha256((PACKAGE / "package-lock.json").read_bytes()).hexdigest()
    if not INSTALLED.exists() or INSTALLED.read_text() != lock:
        run(["npm", "ci", "--no-audit", "--no-fund"], PACKAGE)
        INSTALLED.write_text(lock)
    run([str(TSC), "-p", "tsconfig.json", "--noEmit"], PACKAGE)
    for built_dir in ("dist", "dist-test"):
        shutil.rmtree(PACKAGE / built_dir, ignore_errors=True)  # nothing left of an old build
    run([str(TSC), "-p", "tsconfig.json"], PACKAGE)
    run([str(TSC), "-p", "test/tsconfig.json"], PACKAGE)
    return PACKAGE


@pytest.mark.django_db(transaction=True)
def test_the_typescript_client_passes_its_tests_against_a_live_server(
    built, live_server, agent, operator
):
    done = run(
        ["node", "--test", "dist-test/"],
        built,
        env={
            "STARTSAFE_URL": live_server.url,
            "STARTSAFE_TOKEN": agent.token,
            "STARTSAFE_OPERATOR": operator.username,
            "STARTSAFE_OPERATOR_PASSWORD": "pw-" + operator.username,  # tests/conftest.py
        },
    )

    summary = dict(
        re.findall(r"^# (tests|pass|fail|skipped|todo|cancelled) (\d+)$", done.stdout, re.M)
    )
    assert summary["fail"] == summary["cancelled"] == "0", done.stdout
    assert summary["skipped"] == summary["todo"] == "0", done.stdout  # nothing skipped silently
    assert int(summary["pass"]) == int(summary["tests"]) > 0, done.stdout


def test_the_package_packs_with_its_types_and_installs_in_an_empty_folder(built, tmp_path):
    packed = run(["npm", "pack", "--json", "--pack-destination", str(tmp_path)], built)
    tarball = tmp_path / json.loads(packed.stdout)[0]["filename"]
    with tarfile.open(tarball) as archive:
        names = set(archive.getnames())
    assert {"package/package.json", "package/dist/index.js", "package/dist/index.d.ts"} <= names
    assert {"package/dist/ai.js", "package/dist/ai.d.ts"} <= names
    assert not any(
        name.startswith(("package/src/", "package/test/", "package/dist-test/")) for name in names
    )
    empty = tmp_path / "empty"
    empty.mkdir()

    run(["npm", "install", "--no-save", "--no-audit", "--no-fund", str(tarball)], empty)

    installed = sorted(
        p.name for p in (empty / "node_modules").iterdir() if p.name != ".package-lock.json"
    )
    assert installed == ["startsafe-client"]  # it needs nothing else
    checks = "\n".join(
        f"import * as m{i} from {entry!r};\n"
        + "".join(
            f"if (typeof m{i}.{name} !== 'function') throw new Error('{entry}: no {name}');\n"
            for name in names_
        )
        for i, (entry, names_) in enumerate(ENTRY_POINTS.items())
    )
    (empty / "check.mjs").write_text(checks + "console.log('imported');\n")
    assert run(["node", "check.mjs"], empty).stdout.strip() == "imported"
    # Its types reach a TypeScript consumer from the tarball alone.
    (empty / "consumer.ts").write_text(
        'import { Client, effect, providerKey } from "startsafe-client";\n'
        'const client = new Client({ baseUrl: "http://127.0.0.1:8000", token: "t" });\n'
        'client.tool("send", effect({ key: (a) => providerKey("mail", "message", a.id) }), '
        "async () => ({}));\n"
        "// @ts-expect-error: the options are typed\n"
        'new Client({ baseUrl: 1, token: "t" });\n'
    )
    run(
        [
            str(TSC),
            "--noEmit",
            "--strict",
            "--module",
            "nodenext",
            "--moduleResolution",
            "nodenext",
            "--types",
            "node",
            "--typeRoots",
            str(built / "node_modules" / "@types"),
            "consumer.ts",
        ],
        empty,
    )
