/**
 * The TypeScript client against a live startsafe server on PostgreSQL. Run by
 * tests/test_typescript_client.py, which starts the server, creates the agent's token
 * and an operator, and passes them in STARTSAFE_URL, STARTSAFE_TOKEN,
 * STARTSAFE_OPERATOR and STARTSAFE_OPERATOR_PASSWORD. Decisions a person takes go
 * through the console over HTTP, as a browser sends them (console.ts).
 */

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import {
  AlreadyRunning,
  AttemptStopped,
  Client,
  type ClientOptions,
  EffectBlocked,
  KeyConflict,
  Reconciliation,
  RunFinished,
  Unauthorized,
  effect,
  intentKey,
  providerKey,
  read,
} from "startsafe-client";

import { Operator } from "./console.js";

const URL_ = process.env["STARTSAFE_URL"] ?? "";
const TOKEN = process.env["STARTSAFE_TOKEN"] ?? "";
const skip = URL_ && TOKEN ? false : "needs a live server: STARTSAFE_URL and STARTSAFE_TOKEN (tests/test_typescript_client.py)";

// A live test that hangs (a heartbeat that never comes) fails instead.
const LIVE_TIMEOUT_MS = 60_000;

function makeClient(options: Partial<ClientOptions> = {}): Client {
  return new Client({ baseUrl: URL_, token: TOKEN, pollIntervalMs: 50, backoffMs: 10, approvalTimeoutMs: 20_000, ...options });
}

/** A run key of its own per test: every test shares the server's database. */
function unique(name: string): string {
  return `${name}-${randomUUID().slice(0, 8)}`;
}

async function effectByKey(client: Client, key: string) {
  const page = await client.listEffects({ key });
  assert.equal(page.items.length, 1, `one effect of key ${key}`);
  return page.items[0]!;
}

test("a run records a read and a keyed effect, then completes", { skip, timeout: LIVE_TIMEOUT_MS }, async () => {
  const client = makeClient();
  const ran: unknown[] = [];
  const lookup = client.tool("lookup_customer", read(), async (a: { email: string }) => ({ email: a.email, name: "Ana" }));
  const sendReply = client.tool(
    "send_reply",
    effect({ key: (a) => providerKey("outlook", "message", a.message_id), preview: (a) => `Reply: ${a.body}` }),
    async (a) => {
      ran.push(a);
      return { sent: a.body };
    },
  );
  const messageId = unique("m");

  const runId = await client.run(unique("ticket"), { title: "A ticket", input: { n: 1 } }, async (run) => {
    assert.equal(run.attempt, 1);
    assert.equal(run.verdict["safe"], true);
    assert.equal((await run.call(lookup, { email: "ana@example.com" })).name, "Ana");
    assert.deepEqual(await run.call(sendReply, { message_id: messageId, body: "Hello" }), { sent: "Hello" });
    return run.id;
  });

  assert.equal(ran.length, 1);
  const answer = (await client.getRun(runId)) as { run: { status: string }; journal: { kind: string }[] };
  assert.equal(answer.run.status, "completed");
  assert.deepEqual(answer.journal.map((call) => call.kind), ["read", "effect"]);
  const recorded = await effectByKey(client, `outlook:message:${messageId}`);
  assert.equal(recorded.status, "done");
  assert.equal(recorded.key_source, "provider");
  assert.deepEqual(recorded.result, { sent: "Hello" });
  assert.equal(recorded["preview"], "Reply: Hello");
});

test("a replay of the same key is deduplicated: the tool runs once", { skip, timeout: LIVE_TIMEOUT_MS }, async () => {
  const client = makeClient();
  const ran: string[] = [];
  const sendReply = client.tool(
    "send_reply",
    effect({ key: (a) => providerKey("outlook", "message", a.message_id) }),
    async (a) => {
      ran.push(a.body);
      return { sent: a.body };
    },
  );
  const messageId = unique("m");

  await client.run(unique("ticket"), async (run) => run.call(sendReply, { message_id: messageId, body: "First wording" }));
  // Another run woken by the same inbound message: the model rewrote the body.
  const replayed = await client.run(unique("ticket-redelivered"), async (run) => {
    const out = await run.call(sendReply, { message_id: messageId, body: "Second wording" });
    assert.equal(run.journal.at(-1)?.action, "skip");
    return out;
  });

  assert.deepEqual(replayed, { sent: "First wording" });
  assert.deepEqual(ran, ["First wording"]);
});

test("an approval with edited arguments executes the edited arguments", { skip, timeout: LIVE_TIMEOUT_MS }, async () => {
  const operator = await Operator.signIn(URL_, process.env["STARTSAFE_OPERATOR"] ?? "", process.env["STARTSAFE_OPERATOR_PASSWORD"] ?? "");
  const campaign = unique("winter");
  const edited = { campaign_id: campaign, subject: "Winter sale, edited by a person", segment: "EU" };
  const told: string[] = [];
  const client = makeClient({
    // A person decides once the call waits: the console page it names is where.
    onWaiting: async (waiting) => {
      told.push(waiting.url);
      assert.equal(waiting.status, "awaiting_approval");
      await operator.approve(waiting.effectId, String(waiting.effect.args_hash), edited);
    },
  });
  const ran: unknown[] = [];
  const sendCampaign = client.tool(
    "send_campaign",
    effect({ key: (a) => intentKey("campaign", { campaign_id: a.campaign_id }), approval: "required" }),
    async (a) => {
      ran.push(a);
      return { sent_to: a.segment, subject: a.subject };
    },
  );

  const out = await client.run(unique("campaign"), async (run) =>
    run.call(sendCampaign, { campaign_id: campaign, subject: "WINTER SALE!!!", segment: "EU" }),
  );

  assert.deepEqual(ran, [edited]); // effect.args from the answer, not the model's
  assert.deepEqual(out, { sent_to: "EU", subject: edited.subject });
  assert.equal(told.length, 1);
  const recorded = await effectByKey(client, `campaign:${campaign}`);
  assert.match(told[0]!, new RegExp(`/effects/${recorded.id}/$`));
  assert.equal(recorded.status, "done");
  assert.deepEqual(recorded.args, edited);
});

test("a rejection throws EffectBlocked with the note for the model", { skip, timeout: LIVE_TIMEOUT_MS }, async () => {
  const operator = await Operator.signIn(URL_, process.env["STARTSAFE_OPERATOR"] ?? "", process.env["STARTSAFE_OPERATOR_PASSWORD"] ?? "");
  const client = makeClient({
    onWaiting: (waiting) => operator.reject(waiting.effectId, String(waiting.effect.args_hash), "Do not promise refunds"),
  });
  const ran: unknown[] = [];
  // Its own name: the server's registry keeps a tool's declared approval for every later call.
  const sendReply = client.tool(
    "send_reply_with_approval",
    effect({ key: (a) => providerKey("outlook", "message", a.message_id), approval: "required" }),
    async (a) => void ran.push(a),
  );

  let runId = "";
  const attempt = client.run(unique("ticket"), async (run) => {
    runId = run.id;
    return run.call(sendReply, { message_id: unique("m"), body: "We refund everything" });
  });

  await assert.rejects(attempt, (error: unknown) => {
    assert.ok(error instanceof EffectBlocked, String(error));
    assert.equal(error.code, "effect_blocked");
    assert.equal(error.note, "Do not promise refunds");
    assert.equal(error.forModel, "rejected by an operator: Do not promise refunds");
    return true;
  });
  assert.deepEqual(ran, []);
  // client.run finished the attempt failed, with the error.
  const answer = (await client.getRun(runId)) as { run: { status: string }; attempts: { status: string; error: string }[] };
  assert.equal(answer.run.status, "failed");
  assert.equal(answer.attempts[0]?.status, "failed");
  assert.match(answer.attempts[0]?.error ?? "", /^EffectBlocked: .*Do not promise refunds/);
});

test("an unknown outcome is settled by the tool's lookup on the next attempt", { skip, timeout: LIVE_TIMEOUT_MS }, async () => {
  const client = makeClient();
  const ran: unknown[] = [];
  const looked: unknown[] = [];
  const messageId = unique("m");
  const sendReply = client.tool(
    "send_reply",
    effect({
      key: (a) => providerKey("outlook", "message", a.message_id),
      reconcile: async (args, found) => {
        looked.push([args, found.status]);
        return Reconciliation.done(`found ${args.message_id} in sent items`, { sent: "found" });
      },
    }),
    async (a) => {
      ran.push(a);
      throw new Error("timed out reading the answer"); // it may have been sent: not reported
    },
  );
  const runKey = unique("ticket");

  await assert.rejects(
    client.run(runKey, async (run) => run.call(sendReply, { message_id: messageId, body: "Hello" })),
    /timed out reading the answer/,
  );
  const unknown = await effectByKey(client, `outlook:message:${messageId}`);
  assert.equal(unknown.status, "unknown"); // the attempt finished failed, the effect was not reported

  const out = await client.run(runKey, async (run) => {
    assert.equal(run.attempt, 2);
    return run.call(sendReply, { message_id: messageId, body: "Hello again" });
  });

  assert.deepEqual(out, { sent: "found" });
  assert.equal(ran.length, 1);
  assert.deepEqual(looked, [[{ message_id: messageId, body: "Hello" }, "unknown"]]);
  const settled = await effectByKey(client, `outlook:message:${messageId}`);
  assert.equal(settled.status, "done");
  assert.equal(settled.decision?.verb, "reconciled");
});

test("error codes from the server are their typed errors", { skip, timeout: LIVE_TIMEOUT_MS }, async () => {
  const wrong = new Client({ baseUrl: URL_, token: "not-a-token", backoffMs: 10 });
  await assert.rejects(
    wrong.run(unique("ticket"), async () => undefined),
    (error: unknown) => error instanceof Unauthorized && error.status === 401 && error.code === "unauthorized",
  );

  const client = makeClient();
  const order = unique("o");
  const refund = client.tool("refund", effect({ key: (a) => intentKey("order", { id: a.id }) }), async () => ({ ok: true }));
  const cancel = client.tool("cancel", effect({ key: (a) => intentKey("order", { id: a.id }) }), async () => ({ ok: true }));
  const runKey = unique("ticket");
  await assert.rejects(
    client.run(runKey, async (run) => {
      await run.call(refund, { id: order });
      await run.call(cancel, { id: order });
    }),
    (error: unknown) => error instanceof KeyConflict && error.status === 409 && error.tool === "refund",
  );

  const finished = unique("finished");
  await client.run(finished, async () => undefined);
  await assert.rejects(
    client.run(finished, async () => undefined),
    (error: unknown) => error instanceof RunFinished && error.code === "run_finished" && error.forModel.length > 0,
  );
});

test("the Idempotency-Key is reused across a retry after a dropped connection", { skip, timeout: LIVE_TIMEOUT_MS }, async () => {
  const keys: string[] = [];
  const losing: typeof fetch = async (input, init) => {
    const response = await fetch(input, init);
    if (init?.method === "POST" && String(input).endsWith("/calls")) {
      keys.push((init.headers as Record<string, string>)["Idempotency-Key"] ?? "");
      if (keys.length === 1) {
        await response.text(); // the server answered; the answer is lost on the way back
        throw new TypeError("fetch failed", { cause: new Error("connection reset after the server answered") });
      }
    }
    return response;
  };
  const client = makeClient({ fetch: losing });
  const ran: unknown[] = [];
  const sendReply = client.tool(
    "send_reply",
    effect({ key: (a) => providerKey("outlook", "message", a.message_id) }),
    async (a) => {
      ran.push(a);
      return { sent: true };
    },
  );

  const runId = await client.run(unique("ticket"), async (run) => {
    await run.call(sendReply, { message_id: unique("m"), body: "Hello" });
    return run.id;
  });

  assert.equal(keys.length, 2);
  assert.equal(keys[0], keys[1]);
  assert.ok(keys[0]);
  assert.equal(ran.length, 1);
  const answer = (await client.getRun(runId)) as { journal: unknown[] };
  assert.equal(answer.journal.length, 1); // the retry got the first answer: one call recorded
});

test("heartbeats go on while the run's function runs, and the finish comes after them", { skip, timeout: LIVE_TIMEOUT_MS }, async () => {
  const sent: string[] = [];
  let beaten: () => void = () => undefined;
  const twoBeats = new Promise<void>((resolve) => (beaten = resolve));
  const recording: typeof fetch = async (input, init) => {
    const path = new URL(String(input)).pathname;
    sent.push(path.split("/").at(-1) ?? "");
    if (path.endsWith("/heartbeat") && sent.filter((p) => p === "heartbeat").length === 2) beaten();
    return fetch(input, init);
  };
  const client = makeClient({ fetch: recording, heartbeatIntervalMs: 20 });

  // The heartbeat timer is unref'd (it never keeps a process alive by itself): an agent
  // awaits its own I/O meanwhile, which this bound on the wait stands for.
  let bound: NodeJS.Timeout | undefined;
  const noBeats = new Promise<never>((_, reject) => {
    bound = setTimeout(() => reject(new Error("no two heartbeats within 30 s")), 30_000);
  });
  await client.run(unique("beating"), async () => Promise.race([twoBeats, noBeats])).finally(() => clearTimeout(bound));

  assert.ok(sent.filter((p) => p === "heartbeat").length >= 2);
  assert.equal(sent.at(-1), "finish");
});

test("a live attempt is taken over only when told to (supersede)", { skip, timeout: LIVE_TIMEOUT_MS }, async () => {
  const client = makeClient();
  const runKey = unique("busy");
  let started: () => void = () => undefined;
  const isRunning = new Promise<void>((resolve) => (started = resolve));
  let release: () => void = () => undefined;
  const held = new Promise<void>((resolve) => (release = resolve));
  const first = client.run(runKey, async (run) => {
    started();
    await held;
    run.check();
  });
  await isRunning;

  for (const supersede of [false, "stale"] as const) {
    // Its heartbeat is fresh: neither takes it over, and the error says what would.
    await assert.rejects(client.run(runKey, { supersede }, async () => undefined), (error: unknown) => {
      assert.ok(error instanceof AlreadyRunning, String(error));
      assert.equal(error.attempt, 1);
      assert.match(error.message, /supersede: true/);
      return true;
    });
  }
  const attempt = await client.run(runKey, { supersede: true }, async (run) => run.attempt);
  release();

  assert.equal(attempt, 2);
  await assert.rejects(first, AttemptStopped); // the first attempt is no longer its own to finish
});
