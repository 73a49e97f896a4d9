/**
 * One attempt of a run: start, heartbeat, each tool call and what its answer means,
 * finish (startsafe_client/attempt.py, in TypeScript).
 *
 * A tool call is recorded in the journal *before* it is made, and the answer decides
 * what happens (api.md, "Action"):
 *
 * - `execute`: the tool runs with `effect.args` from the answer (the version to
 *   execute, possibly edited by an operator), not with what the model generated this
 *   time; its result is reported `done`;
 * - `skip`: already done: the recorded result is returned, nothing runs;
 * - `wait`: bounded polling of the effect (with `ETag`/`If-None-Match`) until it can be
 *   claimed (then it executes), is done (skip), blocked or in review;
 * - `review`: its outcome is unknown: the spec's reconcile lookup settles it, or
 *   `OutcomeUnknown` is thrown for a person to decide;
 * - `blocked`: `EffectBlocked`, with the decision's note for the model.
 *
 * **An error is not proof that nothing happened.** When an effect's tool throws, the
 * effect is *not* reported: a tool that sent the e-mail and then timed out reading the
 * answer did the effect. The error propagates; the attempt ends (`client.run` finishes
 * it `failed`) and the server makes the effect `unknown`, so the next attempt
 * reconciles it or a person decides. Only a tool that throws `NotPerformed` (or a class
 * its spec lists in `notPerformed`) has the effect reported `failed`, and the next call
 * of that key runs it again.
 */

import type { Client } from "./client.js";
import {
  AlreadyRunning,
  ApprovalTimeout,
  AttemptStopped,
  ClaimConflict,
  EffectBlocked,
  type EffectError,
  type EffectErrorOptions,
  OutcomeUnknown,
  StartsafeError,
} from "./errors.js";
import { Reconciliation, Tool, type ToolFunction, type ToolSpec, asResult, fromResult } from "./specs.js";
import type { Action, Args, Call, CallAnswer, Effect, EffectAnswer, Result } from "./types.js";

const MAX_ERROR_TEXT = 4000;
const MAX_EVIDENCE_TEXT = 2000;

export interface RunOptions {
  /** The run's title (fixed by its first start). */
  title?: string;
  /** The run's input, a JSON object (fixed by its first start). */
  input?: Record<string, unknown>;
  /** `"keyed"` (the server's default), `"blunt"` or `"manual"`. */
  restartPolicy?: "keyed" | "blunt" | "manual";
  /** Seconds without a heartbeat after which an attempt is presumed dead (60; 5–86,400). */
  heartbeatTimeout?: number;
  /** Where startsafe POSTs when the run is ready to restart. */
  restartUrl?: string;
  /** The agent's code or prompt version, kept on the attempt. */
  agentVersion?: string;
  /**
   * On a live attempt: `false` (the default) throws `AlreadyRunning`; `true` takes it
   * over; `"stale"` takes it over once its heartbeat is older than the run's
   * `heartbeat_timeout` (it is presumed dead).
   */
  supersede?: boolean | "stale";
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function errorText(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}

/** One attempt of a run, made by `client.run`; its function receives it. */
export class Run {
  readonly client: Client;
  readonly runKey: string;
  readonly supersede: boolean | "stale";
  /** The run's id and this attempt's number. */
  id = "";
  attempt = 0;
  /** The Run object, the Attempt, the verdict, the journal and the effects it points to. */
  run: Record<string, unknown> = {};
  attemptInfo: Record<string, unknown> = {};
  verdict: Record<string, unknown> = {};
  journal: Call[] = [];
  effects: Effect[] = [];
  private readonly startBody: Record<string, unknown>;
  private stoppedBy: AttemptStopped | null = null;
  private finished = false;
  private heartbeatTimer: NodeJS.Timeout | null = null;
  private beating: Promise<unknown> | null = null;
  private beatingOn = false;

  constructor(client: Client, runKey: string, options: RunOptions = {}) {
    const supersede = options.supersede ?? false;
    if (supersede !== true && supersede !== false && supersede !== "stale") {
      throw new RangeError("supersede must be true, false or 'stale'");
    }
    this.client = client;
    this.runKey = runKey;
    this.supersede = supersede;
    this.startBody = { run_key: runKey, heartbeat_timeout: options.heartbeatTimeout ?? 60 };
    const optional: [string, unknown][] = [
      ["title", options.title],
      ["input", options.input],
      ["restart_policy", options.restartPolicy],
      ["restart_url", options.restartUrl],
      ["agent_version", options.agentVersion],
    ];
    for (const [name, value] of optional) if (value !== undefined && value !== null) this.startBody[name] = value;
  }

  // --- calls ------------------------------------------------------------------------

  /**
   * Call a declared tool: record the call, then act on the answer. Returns the tool's
   * result: for a read, what the function returns; for an effect, its result as recorded
   * (executed now, or the recorded one on a replay).
   *
   * Throws `KeyRefused` (nothing recorded), `ToolNotRegistered`, `EffectBlocked`,
   * `ApprovalTimeout`, `OutcomeUnknown` (each with `forModel`), `AttemptSuperseded` /
   * `RunFinished` (stop), `NotPerformed` from the tool (reported failed), or any other
   * error of the tool, unreported: the effect's outcome is unknown until the next
   * attempt reconciles it or a person decides.
   */
  async call<A extends Args, R>(tool: Tool<A, R>, args: A): Promise<Awaited<R>> {
    if (!(tool instanceof Tool)) throw new TypeError("run.call takes a tool declared with client.tool");
    await this.client.declareBefore(tool.name, tool.spec as ToolSpec<never>);
    return (await this.callTool(tool, args)) as Awaited<R>;
  }

  /**
   * Journal one call of a tool known by its name and spec: the adapters' entry. Exactly
   * what {@link call} does, for a framework's tool declared beside it with `read()` or
   * `effect()`. `perform` receives the arguments to run with: the arguments given for a
   * read, `effect.args` from the `execute` answer for an effect (an operator may have
   * edited them). Returns and throws what {@link call} does.
   */
  async callSpec<A extends Args, R>(
    name: string,
    spec: ToolSpec<A>,
    args: A,
    perform: ToolFunction<A, R>,
  ): Promise<Awaited<R>> {
    return this.call(new Tool(name, spec, perform), args);
  }

  // --- state that needs no I/O --------------------------------------------------------

  /** The reason this attempt must stop, once a heartbeat learned it; else `null`. */
  get stopped(): AttemptStopped | null {
    return this.stoppedBy;
  }

  /**
   * Throw `AttemptSuperseded` / `RunFinished` if the attempt was stopped. `run.call`
   * checks before every call; call this in long loops that call no tool.
   */
  check(): void {
    if (this.stoppedBy !== null) throw this.stoppedBy;
  }

  /** Milliseconds between two heartbeats: a third of the run's `heartbeat_timeout`. */
  get heartbeatIntervalMs(): number {
    return Math.max(500, (Number(this.run["heartbeat_timeout"]) || 60) * 1000 / 3);
  }

  // --- start, beat, finish ------------------------------------------------------------

  /**
   * Start (or restart) the run; on `409 already_running` supersede the live attempt only
   * when told to (`supersede`). A refused restart throws `RestartBlocked`.
   */
  async start(): Promise<void> {
    let answer: Record<string, unknown>;
    try {
      answer = await this.client.post("/runs", this.startBody);
    } catch (error) {
      if (!(error instanceof AlreadyRunning)) throw error;
      answer = await this.supersedeOrThrow(error);
    }
    this.run = answer["run"] as Record<string, unknown>;
    this.attemptInfo = answer["attempt"] as Record<string, unknown>;
    this.id = String(this.run["id"]);
    this.attempt = Number(this.attemptInfo["number"]);
    this.verdict = (answer["verdict"] as Record<string, unknown> | undefined) ?? {};
    this.journal = (answer["journal"] as Call[] | undefined) ?? [];
    this.effects = (answer["effects"] as Effect[] | undefined) ?? [];
  }

  private async supersedeOrThrow(running: AlreadyRunning): Promise<Record<string, unknown>> {
    if (running.attempt !== null && (await this.shouldSupersede(running))) {
      try {
        return await this.client.post("/runs", { ...this.startBody, supersede: running.attempt });
      } catch (again) {
        if (!(again instanceof AlreadyRunning)) throw again;
        running = again; // another start took the run over first
      }
    }
    // The API's wording ("send supersede with its number") misleads here: say it in
    // the terms of client.run.
    throw new AlreadyRunning(await this.alreadyRunningMessage(running), {
      code: running.code,
      status: running.status,
      details: running.details,
    });
  }

  private async shouldSupersede(running: AlreadyRunning): Promise<boolean> {
    if (this.supersede === true) return true;
    const age = heartbeatAgeSeconds(running);
    if (this.supersede !== "stale" || age === null) return false;
    return age > (await this.runHeartbeatTimeout());
  }

  /** The run's `heartbeat_timeout`: its first start fixed it, so ask the server. */
  private async runHeartbeatTimeout(): Promise<number> {
    let timeout = Number(this.startBody["heartbeat_timeout"]);
    const found = (await this.client.get("/runs", { run_key: this.runKey }))?.items;
    if (Array.isArray(found) && found[0]?.run_key === this.runKey) {
      timeout = Number(found[0].heartbeat_timeout ?? timeout);
    }
    return timeout;
  }

  private async alreadyRunningMessage(running: AlreadyRunning): Promise<string> {
    let timeout: number;
    try {
      timeout = await this.runHeartbeatTimeout();
    } catch (error) {
      if (!(error instanceof StartsafeError)) throw error;
      timeout = Number(this.startBody["heartbeat_timeout"]);
    }
    const age = heartbeatAgeSeconds(running);
    const beat = age === null ? "no heartbeat yet" : `last heartbeat ${Math.round(Math.max(age, 0))} s ago`;
    const head = `run ${JSON.stringify(this.runKey)} already has a running attempt ${running.attempt} (${beat})`;
    if (this.supersede === true) return `${head}: another start took the run over first`;
    if (this.supersede === "stale") {
      return (
        `${head}, not older than the run's heartbeat_timeout of ${timeout} s: start again later, ` +
        "or pass supersede: true to take over now if you know that it died"
      );
    }
    return (
      `${head}: pass supersede: true to take over now, or supersede: "stale" to take over ` +
      `once its heartbeat is older than ${timeout} s`
    );
  }

  /** One heartbeat; whether to go on beating (not once the attempt stopped). */
  async beat(): Promise<boolean> {
    try {
      await this.client.post(`/runs/${this.id}/heartbeat`, { attempt: this.attempt });
    } catch (error) {
      if (error instanceof AttemptStopped) {
        this.stoppedBy = error;
        return false;
      }
      return true; // a missed beat is retried at the next one
    }
    return true;
  }

  /** @internal Heartbeat every `intervalMs` (a third of the run's timeout by default), on an unref'd timer. */
  startHeartbeats(intervalMs: number | null): void {
    const every = intervalMs ?? this.heartbeatIntervalMs;
    this.beatingOn = true;
    const schedule = () => {
      this.heartbeatTimer = setTimeout(() => {
        this.beating = this.beat().then((goOn) => {
          if (goOn && this.beatingOn) schedule();
        });
      }, every);
      this.heartbeatTimer.unref();
    };
    schedule();
  }

  /** @internal Stop heartbeating, after the beat in flight if there is one. */
  async stopHeartbeats(): Promise<void> {
    this.beatingOn = false;
    if (this.heartbeatTimer !== null) clearTimeout(this.heartbeatTimer);
    this.heartbeatTimer = null;
    await this.beating;
  }

  /** Finish this attempt (`client.run` does it); once. */
  async finish(outcome: "completed" | "failed", error?: string): Promise<void> {
    if (this.finished) return;
    const body: Record<string, unknown> = { attempt: this.attempt, outcome };
    if (error) body["error"] = error.slice(0, MAX_ERROR_TEXT);
    const answer = await this.client.post(`/runs/${this.id}/finish`, body);
    this.finished = true;
    this.run = (answer?.run as Record<string, unknown> | undefined) ?? this.run;
  }

  /**
   * @internal How `client.run` ends: completed when its function returned; failed with
   * the error text when it threw (the effects left in flight become `unknown`); nothing
   * for an `AttemptStopped`, as the attempt is no longer this process's to finish.
   */
  async leave(failed: boolean, error?: unknown): Promise<void> {
    if (!failed) {
      await this.finish("completed");
    } else if (!(error instanceof AttemptStopped)) {
      try {
        await this.finish("failed", errorText(error));
      } catch (finishing) {
        // The function's own error is the one that matters: it is thrown on.
        if (!(finishing instanceof StartsafeError)) throw finishing;
      }
    }
  }

  // --- one tool call ------------------------------------------------------------------

  /** Record the call (after the key rule found a key), then act on the answer. */
  private async callTool<A extends Args, R>(tool: Tool<A, R>, given: A): Promise<unknown> {
    this.check();
    const args = { ...given };
    const body = await this.callBody(tool, args); // a KeyRefused here records nothing
    const answer: CallAnswer = await this.client.post(`/runs/${this.id}/calls`, body);
    this.journal.push(answer.call);
    if (tool.spec.kind === "read") return await tool.fn(args);
    if (answer.effect === null) throw new StartsafeError("an effect's call was answered without an effect", { code: "unexpected" });
    return fromResult(await this.follow(tool, answer.action, answer.effect));
  }

  /** `POST /runs/{id}/calls`'s body: the call, and the effect's declaration. */
  private async callBody<A extends Args>(tool: Tool<A, unknown>, args: A): Promise<Record<string, unknown>> {
    const spec = tool.spec;
    const body: Record<string, unknown> = { attempt: this.attempt, tool: tool.name, kind: spec.kind, args };
    const key = await spec.keyFor(tool.name, args);
    if (key !== null) {
      body["key"] = key.value;
      body["key_source"] = key.source;
    }
    if (spec.needsApproval) {
      body["needs_approval"] = true;
      body["approvals_required"] = spec.approvalsRequired;
      if (spec.approvalTtl !== null) body["approval_ttl"] = spec.approvalTtl;
    }
    const preview = spec.previewFor(args);
    if (preview !== null) body["preview"] = preview;
    if (spec.timeout !== null) body["timeout"] = spec.timeout;
    return body;
  }

  /**
   * Act on an effect's action until it executes, skips, or must stop: `execute` runs
   * it, `skip` returns the recorded result, `claim` claims it, `wait` polls (bounded by
   * the client's `approvalTimeoutMs`), `review` runs the reconcile lookup once and goes
   * on with its answer (else `OutcomeUnknown`), `blocked` throws `EffectBlocked`.
   */
  private async follow<A extends Args>(tool: Tool<A, unknown>, action: Action, effect: Effect): Promise<Result> {
    let deadline: number | null = null;
    let reconciled = false;
    for (;;) {
      if (action === "execute") return await this.execute(tool, effect);
      if (action === "skip") return isObject(effect.result) ? effect.result : {};
      if (action === "claim") {
        this.check();
        const answer: EffectAnswer = await this.client.post(`/effects/${effect.id}/claim`, {
          run_id: this.id,
          attempt: this.attempt,
        });
        ({ action, effect } = answer);
      } else if (action === "blocked") {
        throw new EffectBlocked(blockedMessage(tool.name, effect), { effect, url: this.client.consoleUrl(effect.id) });
      } else if (action === "review") {
        if (tool.spec.reconcile === null || reconciled) {
          const why = reconciled ? "is still in review after the lookup" : "is unknown and the tool has no reconcile lookup";
          throw this.forAPerson(OutcomeUnknown, effect, `${tool.name}: the outcome of effect ${effect.id} ${why}`);
        }
        reconciled = true;
        ({ action, effect } = await this.reconcile(tool, effect));
      } else if (action === "wait") {
        if (deadline === null) {
          // The wait begins: once per call.
          deadline = this.client.clock() + this.client.approvalTimeoutMs;
          await this.tellWaiting(tool.name, effect);
        }
        ({ action, effect } = await this.wait(tool.name, effect, deadline));
      } else {
        throw new StartsafeError(`unexpected action ${JSON.stringify(action)}`, { code: "unexpected" });
      }
    }
  }

  /**
   * Run the tool with the effect's recorded args, then report what is known: its result
   * `done`; `failed` when it throws `NotPerformed` (or a class of the spec's
   * `notPerformed`); nothing at all when it throws anything else (the error goes on, and
   * the effect becomes `unknown` when the attempt ends).
   */
  private async execute<A extends Args>(tool: Tool<A, unknown>, effect: Effect): Promise<Result> {
    const complete = `/effects/${effect.id}/complete`;
    const base = { run_id: this.id, attempt: this.attempt };
    let value: unknown;
    try {
      value = await tool.fn((effect.args ?? {}) as A);
    } catch (error) {
      if (!tool.spec.performedNothing(error)) throw error; // unreported: not proof of nothing
      try {
        await this.client.post(complete, { ...base, outcome: "failed", error: errorText(error).slice(0, MAX_ERROR_TEXT) });
      } catch (reporting) {
        if (!(reporting instanceof StartsafeError)) throw reporting;
      }
      throw error;
    }
    const result = asResult(value);
    const answer = await this.client.post(complete, { ...base, outcome: "done", result });
    const recorded = answer?.effect?.result;
    return isObject(recorded) ? recorded : result;
  }

  /** Call the client's `onWaiting` with where a person decides. */
  private async tellWaiting(tool: string, effect: Effect): Promise<void> {
    if (this.client.onWaiting === null) return;
    await this.client.onWaiting({
      tool,
      effect,
      effectId: effect.id,
      status: typeof effect.status === "string" ? effect.status : null,
      url: this.client.consoleUrl(effect.id),
      timeoutMs: this.client.approvalTimeoutMs,
    });
  }

  /** Poll the effect until its action is no longer `wait`, or the deadline. */
  private async wait(tool: string, effect: Effect, deadline: number): Promise<EffectAnswer> {
    let etag: string | null = null;
    let interval = this.client.pollIntervalMs;
    for (;;) {
      this.check();
      const remaining = deadline - this.client.clock();
      if (remaining <= 0) {
        throw this.forAPerson(
          ApprovalTimeout,
          effect,
          `${tool}: effect ${effect.id} still waits (${String(effect.status)}) after ` +
            `${this.client.approvalTimeoutMs / 1000}s; run again once decided`,
        );
      }
      await this.client.sleep(Math.min(interval, remaining));
      interval = Math.min(interval * 1.5, this.client.pollMaxIntervalMs);
      const polled = await this.client.pollEffect(effect.id, etag);
      etag = polled.etag;
      if (polled.answer === null) continue;
      effect = polled.answer.effect;
      if (polled.answer.action !== "wait") return polled.answer as EffectAnswer;
    }
  }

  /** The error that stops a call until a person decides, naming the console page. */
  private forAPerson(
    cls: new (message: string, options: EffectErrorOptions) => EffectError,
    effect: Effect,
    what: string,
  ): EffectError {
    const url = this.client.consoleUrl(effect.id);
    return new cls(`${what}; a person decides at ${url}`, { effect, url });
  }

  /** Run the spec's lookup and report what it found; `null` means nobody knows. */
  private async reconcile<A extends Args>(tool: Tool<A, unknown>, effect: Effect): Promise<EffectAnswer> {
    const lookup = tool.spec.reconcile;
    if (lookup === null) throw new TypeError("no reconcile lookup");
    const found = await lookup((effect.args ?? {}) as A, effect);
    if (found === null || found === undefined) {
      throw this.forAPerson(
        OutcomeUnknown,
        effect,
        `${tool.name}: the lookup could not tell whether effect ${effect.id} happened`,
      );
    }
    if (!(found instanceof Reconciliation)) {
      throw new TypeError("a reconcile lookup returns Reconciliation.done(…), Reconciliation.notDone(…) or null");
    }
    const body: Record<string, unknown> = {
      run_id: this.id,
      attempt: this.attempt,
      outcome: found.outcome,
      evidence: found.evidence.slice(0, MAX_EVIDENCE_TEXT),
    };
    if (found.result !== null) body["result"] = found.result;
    try {
      return await this.client.post(`/effects/${effect.id}/reconcile`, body);
    } catch (error) {
      if (!(error instanceof ClaimConflict)) throw error;
      // Settled meanwhile (a person decided, or a late report came): go on from it.
      return await this.client.get(`/effects/${effect.id}`);
    }
  }
}

function blockedMessage(tool: string, effect: Effect): string {
  const decision = effect.decision ?? {};
  const verb = decision.verb || effect.status || "blocked";
  const note = decision.note || "";
  const text = `${tool}: effect ${effect.id} is ${String(effect.status)} (${verb})`;
  return note ? `${text}: ${note}` : text;
}

/** Seconds since the live attempt's last heartbeat (`null` when not given). */
function heartbeatAgeSeconds(running: AlreadyRunning): number | null {
  if (!running.heartbeatAt) return null;
  const at = Date.parse(running.heartbeatAt);
  return Number.isNaN(at) ? null : (Date.now() - at) / 1000;
}
