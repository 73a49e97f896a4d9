/**
 * The AI SDK adapter (`startsafe-client/ai`) on the SDK's own loop: `generateText` with
 * its mock model (`ai/test`), against a live server (tests/test_typescript_client.py
 * gives the address, an agent's token and an operator's credentials; without them the
 * live tests are skipped). An operator decides at the console over HTTP while a call
 * waits (the client's `onWaiting`).
 */

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { describe, it } from "node:test";

import { generateText, stepCountIs, tool } from "ai";
import type { ToolSet } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { z } from "zod";
import { Client, NotPerformed, Reconciliation, effect, intentKey, providerKey, read } from "startsafe-client";
import type { ClientOptions, Run, Waiting } from "startsafe-client";
import { NeedsPerson, journaled } from "startsafe-client/ai";
import type { JournaledTools, Specs } from "startsafe-client/ai";

import { Operator } from "./console.js";

const env = process.env;
const live = env["STARTSAFE_URL"] && env["STARTSAFE_TOKEN"] && env["STARTSAFE_OPERATOR"];
const NOTE = "Not this week: legal has not cleared the 20% claim.";
const USAGE = {
  inputTokens: { total: 0, noCache: 0, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 0, text: 0, reasoning: 0 },
};

/** A model that makes these calls, one per step, then answers "done". */
function scripted(...calls: [string, Record<string, unknown>][]): MockLanguageModelV3 {
  let step = 0;
  return new MockLanguageModelV3({
    doGenerate: async () => {
      const call = calls[step++];
      if (!call) {
        return { content: [{ type: "text", text: "done" }], finishReason: { unified: "stop", raw: undefined }, usage: USAGE, warnings: [] };
      }
      const [toolName, input] = call;
      return {
        content: [{ type: "tool-call", toolCallId: `call-${step}`, toolName, input: JSON.stringify(input) }],
        finishReason: { unified: "tool-calls", raw: undefined },
        usage: USAGE,
        warnings: [],
      };
    },
  });
}

/** What the model heard on each of its turns after the first: the last tool result's output. */
function heard(model: MockLanguageModelV3): unknown[] {
  return model.doGenerateCalls.slice(1).map((call) => {
    const results = call.prompt.flatMap((m) => (m.role === "tool" ? m.content : []));
    const last = results.at(-1);
    return last && last.type === "tool-result" ? last.output : undefined;
  });
}

/** The campaign tool, its sends kept in `sent`; the campaign id keys it, a person approves it. */
function campaignTools(sent: Record<string, unknown>[]) {
  const tools = {
    launch_campaign: tool({
      inputSchema: z.object({ campaign_id: z.string(), subject: z.string(), recipients: z.number().int() }),
      execute: async (args) => {
        sent.push(args);
        return { sent: args.subject, to: args.recipients };
      },
      // The tool's own conversion expects its own output.
      toModelOutput: ({ output }) => ({ type: "text", value: `sent ${output.sent.toUpperCase()}` }),
    }),
  };
  const specs: Specs<typeof tools> = {
    launch_campaign: effect({ key: (a) => intentKey("campaign", { campaign_id: a.campaign_id }), approval: "required" }),
  };
  return { tools, specs };
}

function client(options: Partial<ClientOptions> = {}): Client {
  return new Client({ baseUrl: env["STARTSAFE_URL"]!, token: env["STARTSAFE_TOKEN"]!, pollIntervalMs: 100, ...options });
}

/** An operator at the console who decides each waiting effect with `decide`. */
async function deciding(decide: (operator: Operator, waiting: Waiting) => Promise<void>): Promise<Partial<ClientOptions>> {
  const operator = await Operator.signIn(env["STARTSAFE_URL"]!, env["STARTSAFE_OPERATOR"]!, env["STARTSAFE_OPERATOR_PASSWORD"]!);
  return { onWaiting: (waiting) => decide(operator, waiting) };
}

/** One attempt of `runKey`: the model's calls through the journaled tools. */
async function attempt<TOOLS extends ToolSet>(
  startsafe: Client,
  runKey: string,
  tools: TOOLS,
  specs: Specs<TOOLS>,
  model: MockLanguageModelV3,
  then: (journal: JournaledTools<TOOLS>, run: Run) => void = (journal) => journal.throwIfUnfinished(),
) {
  return startsafe.run(runKey, { supersede: true }, async (run) => {
    const journal = journaled(run, tools, specs);
    const result = await generateText({ model, tools: journal.tools, stopWhen: [stepCountIs(6), journal.stopWhen], prompt: "go" });
    then(journal, run);
    return { result, journal };
  });
}

// A live test that hangs (a decision that never comes) fails instead.
const LIVE = { skip: !live && "no live server (run from tests/test_typescript_client.py)", timeout: 60_000 };

describe("startsafe-client/ai", LIVE, () => {
  it("hands an operator's rejection note to the model as the tool's result", async () => {
    const sent: Record<string, unknown>[] = [];
    const { tools, specs } = campaignTools(sent);
    const campaign = { campaign_id: `c-${randomUUID()}`, subject: "20% off", recipients: 240 };
    const model = scripted(["launch_campaign", campaign]);
    const options = await deciding((operator, w) => operator.reject(w.effectId, String(w.effect.args_hash), NOTE));

    const startsafe = client(options);
    const { result, journal } = await attempt(startsafe, `r-${randomUUID()}`, tools, specs, model);

    assert.deepEqual(sent, []);
    assert.equal(result.steps[0]!.toolResults[0]!.output, `rejected by an operator: ${NOTE}`);
    // As text, not through the tool's own toModelOutput (which expects what it returns).
    assert.deepEqual(heard(model), [{ type: "text", value: `rejected by an operator: ${NOTE}` }]);
    assert.deepEqual([journal.waiting, journal.stopped], [[], []]);
    // Declared before its first call with its input's JSON Schema, for the tools page.
    const { items } = await startsafe.get("/tools");
    const declared = items.find((t: { name: string }) => t.name === "launch_campaign");
    assert.deepEqual(Object.keys(declared.schema.properties).sort(), ["campaign_id", "recipients", "subject"]);
  });

  it("runs the tool with the arguments an operator edited, once, and a replay answers the recorded result", async () => {
    const sent: Record<string, unknown>[] = [];
    const { tools, specs } = campaignTools(sent);
    const campaign = { campaign_id: `c-${randomUUID()}`, subject: "20% off", recipients: 240 };
    const edited = { ...campaign, subject: "Winter sale (checked by marketing)", recipients: 200 };
    const options = await deciding((operator, w) => operator.approve(w.effectId, String(w.effect.args_hash), edited));
    const runKey = `r-${randomUUID()}`;

    const first = scripted(["launch_campaign", campaign]);
    const crashed = attempt(client(options), runKey, tools, specs, first, () => {
      throw new Error("the process dies after the call");
    });
    await assert.rejects(crashed, /dies/);
    assert.deepEqual(sent, [edited]);
    assert.deepEqual(heard(first), [{ type: "text", value: "sent WINTER SALE (CHECKED BY MARKETING)" }]);

    // The next attempt's model words it otherwise: the same campaign, not sent again.
    const again = scripted(["launch_campaign", { ...campaign, subject: "Our winter offer" }]);
    const { result } = await attempt(client(), runKey, tools, specs, again);
    assert.deepEqual(sent, [edited]);
    assert.deepEqual(result.steps[0]!.toolResults[0]!.output, { sent: edited.subject, to: 200 });
  });

  it("edited arguments that do not fit the tool's schema are not sent, and the model hears why", async () => {
    const sent: Record<string, unknown>[] = [];
    const { tools, specs } = campaignTools(sent);
    const campaign = { campaign_id: `c-${randomUUID()}`, subject: "20% off", recipients: 240 };
    const options = await deciding((operator, w) =>
      operator.approve(w.effectId, String(w.effect.args_hash), { ...campaign, recipients: "everyone" }),
    );
    const model = scripted(["launch_campaign", campaign]);

    const { journal } = await attempt(client(options), `r-${randomUUID()}`, tools, specs, model);

    assert.deepEqual(sent, []);
    const [told] = heard(model) as { type: string; value: string }[];
    assert.equal(told!.type, "error-text");
    assert.match(told!.value, /launch_campaign: the arguments do not fit the tool's input schema/);
    assert.deepEqual(journal.stopped, []); // reported failed: the model may ask again
  });

  it("a decision pending past the approval timeout is a tool error naming the console page", async () => {
    const sent: Record<string, unknown>[] = [];
    const { tools, specs } = campaignTools(sent);
    const campaign = { campaign_id: `c-${randomUUID()}`, subject: "20% off", recipients: 240 };
    const model = scripted(["launch_campaign", campaign]);
    const startsafe = client({ approvalTimeoutMs: 300 });

    const running = attempt(startsafe, `r-${randomUUID()}`, tools, specs, model);

    await assert.rejects(running, (error: unknown) => {
      assert.ok(error instanceof NeedsPerson);
      const [waiting] = error.waiting;
      assert.equal(waiting!.url, startsafe.consoleUrl(waiting!.effectId!));
      assert.deepEqual(heard(model), [
        { type: "error-text", value: `not performed yet: it waits (awaiting_approval) for a person's decision at ${waiting!.url}` },
      ]);
      return true;
    });
    assert.deepEqual(sent, []);
  });

  it("an effect's tool that throws is unreported: the loop stops, the attempt fails, the next reconciles", async () => {
    const replies: string[] = [];
    const tools = {
      search: tool({ inputSchema: z.object({ q: z.string() }), execute: async ({ q }) => ({ found: q }) }),
      reply_to_message: tool({
        inputSchema: z.object({ message_id: z.string(), body: z.string() }),
        execute: async ({ message_id }): Promise<{ sent: boolean }> => {
          replies.push(message_id);
          throw new Error("connection reset after the send");
        },
      }),
    };
    const specs: Specs<typeof tools> = {
      search: read(),
      reply_to_message: effect({
        key: (a) => providerKey("outlook", "message", a.message_id),
        reconcile: (a) =>
          replies.includes(a.message_id) ? Reconciliation.done("in sent items", { sent: true }) : Reconciliation.notDone("not in sent items"),
      }),
    };
    const reply = { message_id: `<${randomUUID()}@mail.example.com>`, body: "Hello" };
    const runKey = `r-${randomUUID()}`;
    const first = scripted(["reply_to_message", reply], ["search", { q: "never asked" }]);

    await assert.rejects(attempt(client(), runKey, tools, specs, first), /connection reset after the send/);
    assert.equal(first.doGenerateCalls.length, 1); // journal.stopWhen: the model acts no further
    assert.deepEqual(replies, [reply.message_id]);

    const again = scripted(["reply_to_message", { ...reply, body: "Hi again" }]);
    const { result } = await attempt(client(), runKey, tools, specs, again);
    assert.deepEqual(replies, [reply.message_id]);
    assert.deepEqual(result.steps[0]!.toolResults[0]!.output, { sent: true });
  });

  it("journals the calls of one step in parallel, each once", async () => {
    const replies: string[] = [];
    const tools = {
      reply_to_message: tool({
        inputSchema: z.object({ message_id: z.string(), body: z.string() }),
        execute: async ({ message_id }) => {
          replies.push(message_id);
          return { replied: message_id };
        },
      }),
    };
    const specs: Specs<typeof tools> = {
      reply_to_message: effect({ key: (a) => providerKey("outlook", "message", a.message_id) }),
    };
    const ids = [`<${randomUUID()}@mail.example.com>`, `<${randomUUID()}@mail.example.com>`];
    const bothAtOnce = () =>
      new MockLanguageModelV3({
        doGenerate: async ({ prompt }) =>
          prompt.some((m) => m.role === "tool")
            ? { content: [{ type: "text", text: "done" }], finishReason: { unified: "stop", raw: undefined }, usage: USAGE, warnings: [] }
            : {
                content: ids.map((id, i) => ({
                  type: "tool-call" as const,
                  toolCallId: `call-${i}`,
                  toolName: "reply_to_message",
                  input: JSON.stringify({ message_id: id, body: `Hello ${randomUUID()}` }),
                })),
                finishReason: { unified: "tool-calls", raw: undefined },
                usage: USAGE,
                warnings: [],
              },
      });
    const runKey = `r-${randomUUID()}`;

    await assert.rejects(
      attempt(client(), runKey, tools, specs, bothAtOnce(), () => {
        throw new Error("the process dies after the step");
      }),
      /dies/,
    );
    const { result } = await attempt(client(), runKey, tools, specs, bothAtOnce());

    assert.deepEqual(replies.sort(), [...ids].sort());
    assert.deepEqual(
      result.steps[0]!.toolResults.map((r) => r.output),
      ids.map((id) => ({ replied: id })),
    );
  });

  it("NotPerformed is reported failed and the model hears it; a refused key records nothing", async () => {
    let tries = 0;
    const tools = {
      load_file: tool({
        inputSchema: z.object({ path: z.string() }),
        execute: async () => {
          tries += 1;
          if (tries === 1) throw new NotPerformed("cannot read the file yet");
          return { imported: true };
        },
      }),
    };
    const specs: Specs<typeof tools> = { load_file: effect({ key: (a) => intentKey("import", { path: a.path }) }) };
    const path = `/data/${randomUUID()}.csv`;
    const model = scripted(["load_file", { path }], ["load_file", { path: "" }], ["load_file", { path }]);

    const { result } = await attempt(client(), `r-${randomUUID()}`, tools, specs, model, (journal, run) => {
      assert.deepEqual(journal.stopped, []);
      assert.equal(run.journal.length, 2); // the refused key was never recorded
    });

    const told = heard(model) as { type: string; value: unknown }[];
    assert.deepEqual(told[0], { type: "error-text", value: "cannot read the file yet" });
    assert.equal(told[1]!.type, "error-text");
    assert.match(String(told[1]!.value), /load_file: no key in these arguments/);
    assert.deepEqual(result.steps[2]!.toolResults[0]!.output, { imported: true });
    assert.equal(tries, 2);
  });
});

describe("journaled", () => {
  const run = {} as Run; // wrapping makes no call

  it("refuses specs for tools it is not given", () => {
    assert.throws(
      () => journaled(run, { a: tool({ inputSchema: z.object({}), execute: async () => 1 }) }, { b: read() } as never),
      /specs name tools that are not given: b/,
    );
  });

  it("types each key rule's arguments by its tool's input schema", () => {
    const tools = { reply: tool({ inputSchema: z.object({ message_id: z.string() }), execute: async () => 1 }) };
    const specs: Specs<typeof tools> = {
      // @ts-expect-error: the tool's input has no field "id"
      reply: effect({ key: (a) => providerKey("outlook", "message", a.id) }),
    };
    assert.ok(journaled(run, tools, specs).tools.reply);
  });

  it("gives back a tool without execute as it is, and keeps each tool's schema and description", () => {
    const asked = tool({ description: "the application answers", inputSchema: z.object({ q: z.string() }) });
    const done = tool({ description: "done here", inputSchema: z.object({ q: z.string() }), execute: async () => 1 });
    const journal = journaled(run, { asked, done });
    assert.equal(journal.tools.asked, asked);
    assert.notEqual(journal.tools.done.execute, done.execute);
    assert.equal(journal.tools.done.description, "done here");
    assert.equal(journal.tools.done.inputSchema, done.inputSchema);
  });
});
