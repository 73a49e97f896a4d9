"""Seed a migrated PostgreSQL database with a journal at scale, with COPY.

At scale 1: 100,000 running runs plus 5,000 stopped or finished ones (the queue's
and the runs page's), 10 effects and 30 calls per run (1.05 M effects, 3.16 M
calls: every 10th run repeats a keyed call), an argument version and an audit
event per effect, 3,000 effects awaiting approval and 500 whose outcome is unknown.
Rows go in through psycopg 3's ``cursor.copy()`` in the text format, generated as
strings: the ORM would take an hour, COPY takes minutes. Foreign-key triggers are
off while copying (``session_replication_role = replica``): the generator keeps
the references right, and checking 5 M of them row by row would double the time.

The bench agent (``BENCH_TOKEN``) owns every 50th run; the rest belong to 49 other
agents, so the poll's "this agent's effect" condition filters for real.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import psycopg

from runs.models import hash_token

BENCH_TOKEN = "ss_bench-token-not-a-secret-0123456789abcdef"
AGENTS = 50
EFFECTS_PER_RUN = 10
READS_PER_EFFECT = 2  # 10 effect calls + 20 reads = 30 calls per run
# Every 10th run repeats its first effect's call, which its key answers skip (a
# prevented duplicate, for the tools and insights pages).
REPLAY_EVERY = 10
CHUNK = 20_000
TOOLS = ("email.send", "crm.update", "billing.refund", "slack.post", "calendar.invite")
WORDS = ("invoice", "onboarding", "refund", "newsletter", "migration", "support", "renewal")


@dataclass
class Seeded:
    """What the benchmark needs to find again: ids of the bench agent's rows."""

    agent_id: str = ""
    runs: int = 0
    running_runs: int = 0
    effects: int = 0
    calls: int = 0
    awaiting: int = 0
    unknown: int = 0
    poll_effects: list[str] = field(default_factory=list)  # the bench agent's, mixed statuses
    detail_run: str = ""  # a run of the bench agent with a full journal
    detail_effect: str = ""  # an awaiting effect
    stopped_runs: int = 0


def _ts(value: datetime) -> str:
    return value.isoformat()


def _copy(cur, table: str, columns: str, rows: list[str]) -> None:
    with cur.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
        copy.write("".join(rows))


class _Buffered:
    """Rows of one table, written with COPY every CHUNK rows."""

    def __init__(self, cur, table: str, columns: str):
        self.cur, self.table, self.columns = cur, table, columns
        self.rows: list[str] = []
        self.count = 0

    def add(self, row: str) -> None:
        self.rows.append(row)
        if len(self.rows) >= CHUNK:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            _copy(self.cur, self.table, self.columns, self.rows)
            self.count += len(self.rows)
            self.rows = []


def seed(dsn: str, scale: float, *, seed_value: int = 7, log=print) -> Seeded:
    rng = random.Random(seed_value)
    now = datetime.now(UTC)
    running = max(100, round(100_000 * scale))
    interrupted, failed, completed = (max(5, round(n * scale)) for n in (2_000, 1_000, 2_000))
    awaiting_target = max(30, round(3_000 * scale))
    unknown_target = max(5, round(500 * scale))
    seeded = Seeded()

    with psycopg.connect(dsn, autocommit=False) as conn, conn.cursor() as cur:
        cur.execute("SET session_replication_role = replica")
        agents = []
        for i in range(AGENTS):
            agent_id = str(uuid.uuid4())
            token = BENCH_TOKEN if i == 0 else f"ss_other-agent-{i}-{uuid.uuid4().hex}"
            agents.append(agent_id)
            cur.execute(
                "INSERT INTO runs_agent (id, name, token_hash, token_hint, is_active, created_at)"
                " VALUES (%s, %s, %s, %s, true, %s)",
                (agent_id, f"bench-agent-{i:02d}", hash_token(token), token[:8], now),
            )
        seeded.agent_id = agents[0]

        run_rows = _Buffered(
            cur,
            "runs_run",
            "id, run_key, title, input, status, restart_policy, heartbeat_timeout, heartbeat_at,"
            " stale_at, current_attempt, restart_ready, restart_url, auto_restarts, override_at,"
            " override_note, created_at, updated_at, agent_id, override_by_id, verdict_blocked",
        )
        attempt_rows = _Buffered(
            cur,
            "runs_attempt",
            "id, number, status, started_at, ended_at, started_by, reason, agent_version,"
            " verdict_at_start, error, run_id",
        )
        effect_rows = _Buffered(
            cur,
            "runs_effect",
            "id, tool, key, key_source, needs_approval, approvals_required, approval_ttl, timeout,"
            " status, args, args_hash, args_versions, preview, result, error, claimed_attempt,"
            " claimed_at, first_claimed_at, timeout_at, approval_expires_at, current_approvals,"
            " decision, revision, created_at, updated_at, agent_id, claimed_run_id, run_id",
        )
        call_rows = _Buffered(
            cur,
            "runs_call",
            "id, attempt_number, seq, tool, kind, args, args_hash, action, at, attempt_id,"
            " effect_id, run_id, prevented_duplicate",
        )
        version_rows = _Buffered(
            cur,
            "runs_effectversion",
            "id, number, args, args_hash, author, adopted, at, call_id, effect_id",
        )
        audit_rows = _Buffered(
            cur,
            "runs_auditevent",
            "id, at, actor, actor_kind, verb, attempt_number, old_status, new_status, note, data,"
            " agent_id, effect_id, run_id",
        )

        statuses = (
            ["running"] * running
            + ["interrupted"] * interrupted
            + ["failed"] * failed
            + ["completed"] * completed
        )
        rng.shuffle(statuses)
        total = len(statuses)
        # Awaiting and unknown effects go to running and stopped runs respectively,
        # spread over the whole table (every k-th run), like a real backlog.
        running_idx = [i for i, s in enumerate(statuses) if s == "running"]
        stopped_idx = [i for i, s in enumerate(statuses) if s in ("interrupted", "failed")]
        awaiting_runs = set(running_idx[:: max(1, len(running_idx) // awaiting_target)])
        unknown_runs = set(stopped_idx[:: max(1, len(stopped_idx) // unknown_target)])
        version_id = 0
        audit_id = 0
        null = r"\N"
        args_json = '{"to": "customer-%d@example.com", "amount": %d, "subject": "%s %d"}'
        for i, status in enumerate(statuses):
            run_id = str(uuid.uuid4())
            agent_index = i % AGENTS
            agent_id = agents[agent_index]
            created = now - timedelta(seconds=(total - i) * 25)  # ~30 days for 105k runs
            word = WORDS[i % len(WORDS)]
            policy = "keyed" if i % 20 else ("blunt" if i % 40 else "manual")
            heartbeat = (
                now - timedelta(seconds=rng.randint(0, 30)) if status == "running" else created
            )
            # Running runs are fresh (an hour of margin); the sweep phase makes 1% stale.
            stale = heartbeat + timedelta(hours=1)
            attempt_id = i + 1  # one attempt per run: explicit ids, so calls can name it
            attempt_status = {"running": "running", "completed": "completed"}.get(
                status, "interrupted" if status == "interrupted" else "failed"
            )
            ended = null if status == "running" else _ts(created + timedelta(minutes=5))
            attempt_rows.add(
                f"{attempt_id}\t1\t{attempt_status}\t{_ts(created)}\t{ended}\tagent\t\t{null}"
                f"\t{null}\t{null}\t{run_id}\n"
            )
            audit_id += 1
            audit_rows.add(
                f"{audit_id}\t{_ts(created)}\tagent:bench-agent-{agent_index:02d}\tagent"
                f"\tattempt_started\t1\t\trunning\t\t{{}}\t{agent_id}\t{null}\t{run_id}\n"
            )
            seq = 0
            unkeyed_started = False
            for j in range(EFFECTS_PER_RUN):
                at = created + timedelta(seconds=j * 10)
                for r in range(READS_PER_EFFECT):
                    seq += 1
                    call_rows.add(
                        f'{uuid.uuid4()}\t1\t{seq}\tsearch.lookup\tread\t{{"q": {r}}}'
                        f"\t{'0' * 64}\texecute\t{_ts(at)}\t{attempt_id}\t{null}\t{run_id}\tf\n"
                    )
                seq += 1
                effect_id = str(uuid.uuid4())
                call_id = str(uuid.uuid4())
                tool = TOOLS[j % len(TOOLS)]
                args = args_json % (i, j, word, j)
                digest = f"{i:032x}{j:032x}"
                keyed = j != EFFECTS_PER_RUN - 1  # the last effect of each run is unkeyed
                key = f"run-{i:07d}:{j}" if keyed else null
                key_source = "intent" if keyed else null
                needs_approval = "f"
                expires = null
                claimed = _ts(at)
                effect_status, action = "done", "execute"
                result = '{"ok": true}'
                if j == EFFECTS_PER_RUN - 1 and i in awaiting_runs:
                    effect_status, action, needs_approval = "awaiting_approval", "wait", "t"
                    expires = _ts(now + timedelta(hours=rng.randint(1, 48)))
                    claimed, result = null, null
                elif j == EFFECTS_PER_RUN - 1 and i in unknown_runs:
                    effect_status, action = "unknown", "execute"
                    result = null
                elif status == "running" and j == EFFECTS_PER_RUN - 1:
                    effect_status, action, claimed, result = "pending", "wait", null, null
                claimed_run = run_id if claimed != null else null
                unkeyed_started = unkeyed_started or (not keyed and claimed != null)
                claimed_attempt = "1" if claimed != null else null
                effect_rows.add(
                    f"{effect_id}\t{tool}\t{key}\t{key_source}\t{needs_approval}\t1\t86400"
                    f"\t{null}\t{effect_status}\t{args}\t{digest}\t1\t{tool} to customer {i}"
                    f"\t{result}\t{null}\t{claimed_attempt}\t{claimed}\t{claimed}\t{null}"
                    f"\t{expires}\t[]\t{null}\t2\t{_ts(at)}\t{_ts(at)}\t{agent_id}"
                    f"\t{claimed_run}\t{run_id}\n"
                )
                call_rows.add(
                    f"{call_id}\t1\t{seq}\t{tool}\teffect\t{args}\t{digest}\t{action}\t{_ts(at)}"
                    f"\t{attempt_id}\t{effect_id}\t{run_id}\tf\n"
                )
                if j == 0 and i % REPLAY_EVERY == 0:
                    # The run asked for its first effect again: its key answered skip.
                    seq += 1
                    call_rows.add(
                        f"{uuid.uuid4()}\t1\t{seq}\t{tool}\teffect\t{args}\t{digest}\tskip"
                        f"\t{_ts(at + timedelta(seconds=5))}\t{attempt_id}\t{effect_id}"
                        f"\t{run_id}\tt\n"
                    )
                version_id += 1
                version_rows.add(
                    f"{version_id}\t1\t{args}\t{digest}\tagent:bench-agent-{agent_index:02d}\tt"
                    f"\t{_ts(at)}\t{call_id}\t{effect_id}\n"
                )
                audit_id += 1
                audit_rows.add(
                    f"{audit_id}\t{_ts(at)}\tagent:bench-agent-{agent_index:02d}\tagent\trecorded"
                    f"\t1\t\t{effect_status}\t\t{{}}\t{agent_id}\t{effect_id}\t{run_id}\n"
                )
                if agent_index == 0 and len(seeded.poll_effects) < 2_000 and j in (0, 9):
                    seeded.poll_effects.append(effect_id)
                if effect_status == "awaiting_approval":
                    seeded.awaiting += 1
                    if agent_index == 0 and not seeded.detail_effect:
                        seeded.detail_effect = effect_id
                elif effect_status == "unknown":
                    seeded.unknown += 1
            # The verdict's blocking rules (runs/verdict.py) over what was just seeded:
            # manual always; blunt: it has calls; keyed: its unkeyed effect started.
            blocked = policy != "keyed" or unkeyed_started
            run_rows.add(
                f"{run_id}\trun-{i:07d}\t{word.title()} task {i}\t{{}}\t{status}\t{policy}\t3600"
                f"\t{_ts(heartbeat)}\t{_ts(stale)}\t1\tf\t{null}\t0\t{null}\t\t{_ts(created)}"
                f"\t{_ts(heartbeat if status == 'running' else created + timedelta(minutes=5))}"
                f"\t{agent_id}\t{null}\t{'t' if blocked else 'f'}\n"
            )
            if agent_index == 0 and status == "running" and not seeded.detail_run:
                seeded.detail_run = run_id
            if (i + 1) % 20_000 == 0:
                log(f"  seeded {i + 1:,} of {total:,} runs")
        for buffered in (run_rows, attempt_rows, effect_rows, call_rows, version_rows, audit_rows):
            buffered.flush()
        # Identity columns were given explicit ids: move their sequences past them.
        for table in ("runs_attempt", "runs_effectversion", "runs_auditevent"):
            cur.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'),"
                f" (SELECT max(id) FROM {table}))"
            )
        conn.commit()
        seeded.runs = run_rows.count
        seeded.running_runs = running
        seeded.stopped_runs = interrupted + failed
        seeded.effects = effect_rows.count
        seeded.calls = call_rows.count
    # Fresh statistics and visibility maps, as a database that has lived would have.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        # Then the seed's dirty pages to disk now. The seed writes gigabytes of WAL;
        # otherwise the checkpoint it starts spreads its writes over the next minutes
        # (checkpoint_completion_target) and the load phase measured it: on
        # 2026-12-03 one ran from the end of the seed to after the last round.
        try:
            conn.execute("CHECKPOINT")
        except psycopg.errors.InsufficientPrivilege:
            log("CHECKPOINT needs a superuser or the pg_checkpoint role: skipped")
    return seeded
