/**
 * The Vercel AI SDK adapter: every `execute` of the SDK's tools goes through a run's journal.
 *
 * ```ts
 * import { generateText, stepCountIs, tool } from "ai";
 * import { effect, intentKey, read } from "startsafe-client";
 * import { journaled, type Specs } from "startsafe-client/ai";
 *
 * const tools = { lookup_customer: tool({...}), send_campaign: tool({...}) };
 * const specs: Specs<typeof tools> = { // each rule sees its tool's input, typed
 *   lookup_customer: read(),
 *   send_campaign: effect({
 *     key: (a) => intentKey("campaign", { campaign_id: a.campaign_id }),
 *     approval: "required",
 *   }),
 * };
 * await client.run("ticket-4812", { supersede: "stale" }, async (run) => {
 *   const journal = journaled(run, tools, specs);
 *   await generateText({ model, tools: journal.tools, stopWhen: [stepCountIs(10), journal.stopWhen], prompt });
 *   journal.throwIfUnfinished(); // a person decides first: the attempt ends failed, run it again later
 * });
 * ```
 *
 * `journaled(run, tools, specs)` gives back the same tools (names, descriptions,
 * schemas, the SDK's own `needsApproval`…) with their `execute` journaled through
 * `run.callSpec`: the protocol core decides what every answer means, as in the Python
 * adapters (startsafe_client/openai_agents.py, langchain.py, pydantic_ai.py). What the
 * model hears, the AI SDK's way (a tool's result, or a tool error: the text of an
 * error thrown by `execute`, which the SDK hands the model while its loop goes on):
 *
 * - `execute`: the tool runs with the effect's recorded arguments, which an operator
 *   may have edited (checked against the tool's `inputSchema` again), and its result is
 *   recorded (of a tool that streams preliminary results, the last one); `skip`: the
 *   recorded result, and the tool does not run again;
 * - rejected by an operator, or expired: the tool's result is the text
 *   `"rejected by an operator: <note>"`, so the model can change course;
 * - still waiting past the client's `approvalTimeoutMs`, or an outcome only a person
 *   can settle: a tool error naming the effect's console page, listed in
 *   `journal.waiting`. While a decision waits, the client's `onWaiting` names the page;
 * - a key the rule cannot build from the arguments: a tool error saying which (the
 *   model's arguments are what to fix);
 * - `NotPerformed` (or a class of the spec's `notPerformed`) from the tool: reported
 *   `failed`, and the model hears the tool's own error text;
 * - any other error of an effect's tool is **not proof that nothing happened**: it is
 *   not reported, the model hears that the outcome is unknown and not to call it
 *   again, and the error is kept in `journal.stopped`, as is any error of the journal
 *   itself (the attempt superseded, the server unreachable). `journal.stopWhen` stops
 *   the SDK's loop after that step, and `journal.throwIfUnfinished()` throws it so that
 *   the run ends the attempt `failed` and the next attempt reconciles the effect.
 *   A read's own errors stay the SDK's ordinary tool errors.
 *
 * A tool without a spec is an unkeyed effect (it runs, and blocks automatic restarts
 * under `keyed`). A tool without `execute` (answered by the client application) or
 * run by the provider is given back as it is: nothing runs here to journal.
 */

import { asSchema } from "ai";
import type { InferToolInput, JSONValue, Tool, ToolExecutionOptions, ToolSet } from "ai";

import {
  ApprovalTimeout,
  EffectBlocked,
  EffectError,
  KeyRefused,
  NotPerformed,
  OutcomeUnknown,
  effect,
} from "./index.js";
import type { Args, Run, ToolSpec } from "./index.js";

/**
 * The tools' declarations by tool name: `read()` or `effect({...})`, whose key rule,
 * preview and lookup receive the tool's input as its `inputSchema` types it.
 */
export type Specs<TOOLS extends ToolSet> = { [NAME in keyof TOOLS]?: ToolSpec<InferToolInput<TOOLS[NAME]>> };

/**
 * Thrown by {@link JournaledTools.throwIfUnfinished}: decisions wait for a person.
 * Thrown inside `client.run`, it ends the attempt `failed`; run it again once decided.
 */
export class NeedsPerson extends Error {
  /** The {@link ApprovalTimeout}s and {@link OutcomeUnknown}s told to the model. */
  readonly waiting: EffectError[];

  constructor(waiting: EffectError[]) {
    super(`waiting for a person: ${waiting.map((e) => `${e.tool || "effect"} at ${e.url}`).join("; ")}`);
    this.name = "NeedsPerson";
    this.waiting = [...waiting];
  }
}

/** The journaled tools, for `generateText`/`streamText`, and what their calls left to do. */
export class JournaledTools<TOOLS extends ToolSet> {
  /** The tools to give the SDK: the same names and schemas, each `execute` journaled. */
  readonly tools: TOOLS;
  /**
   * Every {@link ApprovalTimeout} or {@link OutcomeUnknown} handed to the model as a
   * tool error, in order: a person decides at `.url` before the run can go on.
   */
  readonly waiting: EffectError[] = [];
  /**
   * Errors the SDK turned into tool errors that must end the attempt `failed`: an
   * effect's tool that threw (its outcome is unknown), or the journal's own (this
   * attempt was superseded, the server could not be reached).
   */
  readonly stopped: unknown[] = [];
  /**
   * A `stopWhen` condition for the SDK's loop: stop once a call {@link stopped}, so the
   * model acts no further in an attempt that must end.
   */
  readonly stopWhen = (): boolean => this.stopped.length > 0;

  private readonly run: Run;
  private declared: Promise<void> | null = null;
  private readonly journaledTools: [string, Tool, ToolSpec<any>][] = [];

  constructor(run: Run, tools: TOOLS, specs: Specs<TOOLS>) {
    this.run = run;
    const wrapped: Record<string, Tool> = {};
    for (const [name, tool] of Object.entries(tools)) {
      // Nothing runs here for a tool the application or the provider answers.
      if (!tool.execute || tool.type === "provider") {
        wrapped[name] = tool;
        continue;
      }
      const spec: ToolSpec<any> = specs[name] ?? effect();
      this.journaledTools.push([name, tool, spec]);
      wrapped[name] = this.wrap(name, tool, spec);
    }
    this.tools = wrapped as TOOLS;
  }

  /** Throw what ends this attempt `failed`: the first of {@link stopped}, else {@link NeedsPerson}. */
  throwIfUnfinished(): void {
    if (this.stopped.length > 0) throw this.stopped[0];
    if (this.waiting.length > 0) throw new NeedsPerson(this.waiting);
  }

  /**
   * Before the first call: the tools' declarations, with their input's JSON Schema,
   * become the client's, so the run declares them (once per process) before its call.
   */
  private declare(): Promise<void> {
    this.declared ??= (async () => {
      const declarations = await Promise.all(
        this.journaledTools.map(async ([name, tool, spec]) => spec.declaration(name, await jsonSchemaOf(tool))),
      );
      this.run.client.adopt(declarations);
    })();
    return this.declared;
  }

  /** The tool as the model sees it, its `execute` journaled (see the module's doc). */
  private wrap(name: string, tool: Tool, spec: ToolSpec<any>): Tool {
    const execute = tool.execute!;
    const blocked = new Set<string>(); // the calls whose result is a rejection's text

    const journaledExecute = async (input: unknown, options: ToolExecutionOptions): Promise<unknown> => {
      let toolThrew = false; // whether an error came from the tool itself, not the journal
      const perform = async (given: Args): Promise<unknown> => {
        try {
          if (spec.kind === "read") return await execute(given as never, options);
          // The effect's recorded arguments (an operator may have edited them), checked
          // as the SDK checked the model's: arguments that do not fit were never sent.
          return await lastOf(execute((await fitting(tool, name, given)) as never, options));
        } catch (error) {
          toolThrew = true;
          throw error;
        }
      };
      try {
        await this.declare();
        return await this.run.callSpec(name, spec, input as Args, perform);
      } catch (error) {
        if (error instanceof EffectBlocked) {
          blocked.add(options.toolCallId);
          return error.forModel;
        }
        if (error instanceof ApprovalTimeout || error instanceof OutcomeUnknown) {
          this.waiting.push(error);
          throw new Error(error.forModel, { cause: error });
        }
        if (error instanceof KeyRefused) throw new Error(error.forModel, { cause: error });
        if (toolThrew && (spec.kind === "read" || spec.performedNothing(error))) throw error;
        this.stopped.push(error);
        if (!toolThrew) throw error;
        // Unreported: the next attempt reconciles it, or a person decides.
        const why = error instanceof Error ? error.message : String(error);
        throw new Error(`${name} failed after it may have acted (${why}); its outcome is unknown: do not call it again`, {
          cause: error,
        });
      }
    };

    const toModelOutput = tool.toModelOutput;
    return {
      ...tool,
      execute: journaledExecute,
      // A rejection's text is not the tool's output: the tool's own conversion would not
      // know it, so the model gets it as text.
      ...(toModelOutput && {
        toModelOutput: (options: Parameters<typeof toModelOutput>[0]) =>
          blocked.has(options.toolCallId)
            ? { type: "text" as const, value: String(options.output) }
            : toModelOutput(options),
      }),
    } as Tool;
  }
}

/**
 * Wrap the SDK's tools so that every `execute` goes through `run`'s journal.
 *
 * @param run the attempt, inside `client.run(runKey, options, async (run) => …)`.
 * @param tools the SDK's tools by name (`tool({...})`), as `generateText` takes them.
 * @param specs each tool's declaration by name, written beside the tools:
 *   `read()` or `effect({ key, approval, approvers, preview, reconcile })`. A tool
 *   without one is an unkeyed effect.
 * @returns a {@link JournaledTools}: `.tools` for the SDK, `.waiting`, `.stopped`,
 *   `.stopWhen` and `.throwIfUnfinished()`.
 */
export function journaled<TOOLS extends ToolSet>(
  run: Run,
  tools: TOOLS,
  specs: Specs<TOOLS> = {},
): JournaledTools<TOOLS> {
  const unknown = Object.keys(specs)
    .filter((name) => !(name in tools))
    .sort();
  if (unknown.length > 0) throw new RangeError(`specs name tools that are not given: ${unknown.join(", ")}`);
  return new JournaledTools(run, tools, specs);
}

/** The arguments as the tool's `inputSchema` validates them; ones that do not fit: NotPerformed. */
async function fitting(tool: Tool, name: string, args: Args): Promise<unknown> {
  const schema = asSchema(tool.inputSchema);
  if (!schema.validate) return args;
  const checked = await schema.validate(args);
  if (checked.success) return checked.value;
  throw new NotPerformed(`${name}: the arguments do not fit the tool's input schema: ${checked.error.message}`);
}

/** The JSON Schema of the tool's input, where the SDK can tell it (else none is declared). */
async function jsonSchemaOf(tool: Tool): Promise<Record<string, unknown> | null> {
  try {
    return (await asSchema(tool.inputSchema).jsonSchema) as Record<string, unknown>;
  } catch {
    return null;
  }
}

/** A tool's output: its value, or the last one it streams (the SDK's preliminary results). */
async function lastOf(output: unknown): Promise<JSONValue | undefined> {
  const value = await output;
  if (value === null || typeof value !== "object" || !(Symbol.asyncIterator in value)) {
    return value as JSONValue | undefined;
  }
  let last: JSONValue | undefined;
  for await (const part of value as AsyncIterable<JSONValue>) last = part;
  return last;
}
