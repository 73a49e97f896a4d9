/**
 * The shared protocol vectors (clients/vectors/protocol.json) through the TypeScript
 * client, with a scripted fetch: the same file the Python client's tests run
 * (tests/test_protocol_vectors.py), so both clients do the same with every answer.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  Client,
  NotPerformed,
  Reconciliation,
  StartsafeError,
  type Waiting,
  asResult,
  effect,
  intentKey,
  read,
} from "startsafe-client";

import { Clock, HARNESS, type Json, Script, VECTORS, same } from "./scripted.js";

// The Python runner asserts the same number: a vector added to the file must be run by both.
const VECTOR_COUNT = 48;

class ToolError extends Error {}
class LookupFailed extends Error {}

function makeClient(script: Script, clock: Clock, told: Waiting[]): Client {
  return new Client({
    baseUrl: HARNESS.base_url,
    token: HARNESS.token,
    fetch: script.fetch,
    sleep: clock.sleep,
    clock: clock.clock,
    maxRetries: HARNESS.max_retries,
    backoffMs: HARNESS.backoff_ms,
    backoffMaxMs: HARNESS.backoff_max_ms,
    pollIntervalMs: HARNESS.poll_interval_ms,
    pollMaxIntervalMs: HARNESS.poll_max_interval_ms,
    approvalTimeoutMs: HARNESS.approval_timeout_ms,
    onWaiting: (waiting) => void told.push(waiting),
  });
}

function theTool(behaviour: Json, ran: Json[]) {
  return async (args: Json) => {
    ran.push(args);
    if (behaviour.throws === "not_performed") throw new NotPerformed("the mail server refused the connection");
    if (behaviour.throws) throw new ToolError("timed out reading the answer");
    return behaviour.returns;
  };
}

function theLookup(behaviour: Json, looked: Json[]) {
  if (behaviour === null) return undefined;
  return async (args: Json) => {
    looked.push(args);
    if (behaviour.throws) throw new LookupFailed("the provider's search is down");
    if (behaviour.returns === "done") return Reconciliation.done(behaviour.evidence, behaviour.result);
    if (behaviour.returns === "not_done") return Reconciliation.notDone(behaviour.evidence);
    return null;
  };
}

function specOf(call: Json, looked: Json[]) {
  if (call.kind === "read") return read();
  // The harness's key rule: intent key "order" of the field id (order:<id>).
  return effect({ key: (a) => intentKey("order", { id: a.id }), reconcile: theLookup(call.reconcile, looked) });
}

function assertError(raised: unknown, expected: Json): void {
  const own: Record<string, unknown> = { "the tool's own": ToolError, "the lookup's own": LookupFailed };
  if (expected.class in own) {
    assert.equal((raised as Error).constructor, own[expected.class], String(raised));
    return;
  }
  assert.equal((raised as Error).constructor.name, expected.class, String(raised));
  const error = raised as StartsafeError;
  if ("code" in expected) assert.equal(error.code, expected.code);
  if ("status" in expected) assert.equal(error.status, expected.status);
  if ("details" in expected) assert.ok(same(error.details, expected.details), JSON.stringify(error.details));
  if ("for_model" in expected) assert.equal(error.forModel, expected.for_model);
}

test("every vector is run here", () => {
  assert.equal(VECTORS.calls.length + VECTORS.requests.length, VECTOR_COUNT);
});

for (const vector of VECTORS.calls as Json[]) {
  test(`a tool call does what the answers say: ${vector.name}`, async () => {
    const { call, expect } = vector;
    const script = new Script(vector.script);
    const clock = new Clock();
    const told: Waiting[] = [];
    const ran: Json[] = [];
    const looked: Json[] = [];
    const client = makeClient(script, clock, told);
    let raised: unknown = null;
    let result: unknown = null;

    try {
      result = await client.run(HARNESS.run.run_key, async (run) =>
        run.callSpec(HARNESS.tool.name, specOf(call, looked), call.args, theTool(call.tool, ran)),
      );
    } catch (error) {
      raised = error;
    }

    assert.deepEqual(script.problems, []);
    assert.deepEqual(script.left(), []);
    if ("error" in expect) {
      assert.ok(raised !== null, `expected ${expect.error.class}, got ${JSON.stringify(result)}`);
      assertError(raised, expect.error);
    } else {
      assert.equal(raised, null, String(raised));
      // An effect's call hands back the tool's value (fromResult of the recorded result);
      // the vector gives the result object, as the Python client returns it.
      assert.deepEqual(call.kind === "read" ? result : asResult(result), expect.result);
    }
    assert.deepEqual(ran, expect.tool_ran_with);
    assert.deepEqual(looked, expect.lookups ?? []);
    assert.equal(told.length, expect.waiting_told ?? 0);
    // Every POST carried an Idempotency-Key; each logical request its own.
    const posts = script.requests.filter((r) => r.method === "POST").map((r) => r.headers["idempotency-key"]);
    assert.ok(posts.every(Boolean));
    assert.equal(new Set(posts).size, posts.length);
  });
}

for (const vector of VECTORS.requests as Json[]) {
  test(`a request is retried or thrown as the answers say: ${vector.name}`, async () => {
    const { expect, request } = vector;
    const script = new Script(vector.script, request);
    const clock = new Clock();
    const client = makeClient(script, clock, []);
    let raised: unknown = null;
    let result: unknown = null;

    try {
      result = (await client.request(request.method, request.path, { json: request.body })).body;
    } catch (error) {
      if (!(error instanceof StartsafeError)) throw error;
      raised = error;
    }

    assert.deepEqual(script.problems, []);
    assert.deepEqual(script.left(), []);
    const tries = expect.tries ?? (expect.retried ? HARNESS.max_retries + 1 : 1);
    assert.equal(script.requests.length, tries);
    assert.equal(clock.sleeps.length, tries - 1);
    if ("sleeps_at_least_ms" in expect) assert.ok(Math.min(...clock.sleeps) >= expect.sleeps_at_least_ms);
    if (expect.one_idempotency_key) {
      const keys = new Set(script.requests.map((r) => r.headers["idempotency-key"]));
      assert.equal(keys.size, 1);
      assert.ok(!keys.has(undefined as never));
    }
    if ("error" in expect) {
      assert.ok(raised !== null, `expected ${expect.error.class}, got ${JSON.stringify(result)}`);
      assertError(raised, expect.error);
    } else {
      assert.equal(raised, null, String(raised));
      assert.deepEqual(result, expect.result);
    }
  });
}
