/**
 * The client: its options, one logical request with safe retries, the tools it
 * declares, and `client.run`, which always finishes the attempt.
 *
 * Every `POST` carries an `Idempotency-Key` (a UUID) that stays the same across the
 * retries of one logical request, so a retry after a lost answer gets the first answer
 * again and never records a call or starts an attempt twice. Network errors and 5xx
 * answers are retried with exponential back-off and jitter; `409 request_in_progress`
 * after a pause; `429` after the server's `Retry-After`; every other 4xx is thrown at
 * once as its typed error (errors.ts). The same rules as the Python client's protocol
 * core (startsafe_client/protocol.py); the shared vectors (clients/vectors/) hold both
 * to them.
 */

import { createHash, randomUUID } from "node:crypto";
import { performance } from "node:perf_hooks";

import { canonicalJson } from "./canonical.js";
import {
  RateLimited,
  RequestInProgress,
  ServiceUnavailable,
  StartsafeError,
  ToolNotRegistered,
  errorFromAnswer,
} from "./errors.js";
import { Run, type RunOptions } from "./run.js";
import { Tool, ToolSpec, type ToolFunction } from "./specs.js";
import type { Args, Effect } from "./types.js";

export const API_PREFIX = "/api/v1";
const DECLARE_BATCH = 500; // api.md, POST /tools: 1–500 tools

/** What a tool call waits for: passed to the client's `onWaiting`, once per call. */
export interface Waiting {
  /** The tool's name. */
  tool: string;
  /** The effect as the answer showed it. */
  effect: Effect;
  effectId: string;
  /** Its status, e.g. `awaiting_approval`. */
  status: string | null;
  /** The effect's page in the console, where a person decides. */
  url: string;
  /** How long the call waits at most (the client's `approvalTimeoutMs`). */
  timeoutMs: number;
}

export interface ClientOptions {
  /** The server's address, e.g. `http://127.0.0.1:8000` (a trailing `/api/v1` is accepted). */
  baseUrl: string;
  /** The agent's bearer token (`python manage.py create_agent NAME`). */
  token: string;
  /** Milliseconds per HTTP request (10,000). */
  timeoutMs?: number;
  /** Retries after the first try, for network errors, 5xx, `request_in_progress`, 429 (5). */
  maxRetries?: number;
  /** The first retry's delay (500 ms); it doubles per retry, with jitter, up to `backoffMaxMs`. */
  backoffMs?: number;
  backoffMaxMs?: number;
  /** Between two polls of an effect that waits (2,000 ms); grows by half up to `pollMaxIntervalMs`. */
  pollIntervalMs?: number;
  pollMaxIntervalMs?: number;
  /** How long a tool call waits for a decision before `ApprovalTimeout` (300,000 ms). */
  approvalTimeoutMs?: number;
  /** Between two heartbeats; a third of the run's `heartbeat_timeout` by default. */
  heartbeatIntervalMs?: number;
  /** The fetch function (tests inject faults with it); the platform's by default. */
  fetch?: typeof globalThis.fetch;
  /** The sleeping function for back-off and polling (tests pass a fake one). */
  sleep?: (ms: number) => void | Promise<void>;
  /** The monotonic clock, in milliseconds, that bounds waits (tests pass a fake one). */
  clock?: () => number;
  /** Called once per tool call that begins to wait: tell the person where to decide. */
  onWaiting?: (waiting: Waiting) => void | Promise<void>;
}

/** An answer below 400: its status, headers and body (parsed JSON, or the text). */
export interface Answer {
  status: number;
  headers: Headers;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  body: any;
}

export interface RequestOptions {
  json?: unknown;
  params?: Record<string, string | number | boolean | null | undefined>;
  headers?: Record<string, string>;
  /** The `Idempotency-Key` of a POST (a new UUID by default), repeated by every retry. */
  idempotencyKey?: string;
}

// The declarations this process sent, by server, token digest, tool name and
// declaration digest: each is sent once per process (api.md: "once per process,
// before the first call"), whatever the number of clients and runs. `declaring`
// makes the check-then-send one step across concurrent calls.
const DECLARED = new Set<string>();
let declaring: Promise<unknown> = Promise.resolve();

function defaultSleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function checkedToken(token: string | undefined | null): string {
  if (!token || !token.trim()) {
    // What `STARTSAFE_TOKEN=$(manage.py create_agent NAME)` leaves when that failed.
    throw new RangeError(
      "the token is empty: pass the agent's token, which `python manage.py create_agent NAME` " +
        "prints on the server (an empty STARTSAFE_TOKEN usually means that command failed: see its error)",
    );
  }
  if (token.trim().split(/\s+/).length !== 1) {
    throw new RangeError(
      "the token has spaces or line breaks: pass only the token, which " +
        "`python manage.py create_agent NAME` prints alone on standard output",
    );
  }
  return token.trim();
}

function parseBody(text: string): unknown {
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

function retryAfterMs(headers: Headers): number {
  const seconds = Number(headers.get("Retry-After") ?? "0");
  return Number.isFinite(seconds) && seconds > 0 ? seconds * 1000 : 0;
}

function describe(error: unknown): { name: string; text: string } {
  if (error instanceof Error) {
    const cause = error.cause instanceof Error ? ` (${error.cause.message})` : "";
    return { name: error.name, text: `${error.name}: ${error.message}${cause}` };
  }
  return { name: typeof error, text: String(error) };
}

/** A startsafe client for one agent. */
export class Client {
  readonly baseUrl: string;
  readonly timeoutMs: number;
  readonly maxRetries: number;
  readonly backoffMs: number;
  readonly backoffMaxMs: number;
  readonly pollIntervalMs: number;
  readonly pollMaxIntervalMs: number;
  readonly approvalTimeoutMs: number;
  readonly heartbeatIntervalMs: number | null;
  readonly onWaiting: ((waiting: Waiting) => void | Promise<void>) | null;
  readonly sleep: (ms: number) => void | Promise<void>;
  readonly clock: () => number;
  private readonly fetchFn: typeof globalThis.fetch;
  private readonly token: string;
  private readonly tokenDigest: string;
  // This client's tools: name -> declaration and its digest, sent before the first call.
  private readonly declarations = new Map<string, { declared: Record<string, unknown>; digest: string }>();

  constructor(options: ClientOptions) {
    this.token = checkedToken(options.token);
    let base = String(options.baseUrl ?? "").replace(/\/+$/, "");
    if (base.endsWith(API_PREFIX)) base = base.slice(0, -API_PREFIX.length);
    this.baseUrl = base;
    this.timeoutMs = options.timeoutMs ?? 10_000;
    this.maxRetries = options.maxRetries ?? 5;
    this.backoffMs = options.backoffMs ?? 500;
    this.backoffMaxMs = options.backoffMaxMs ?? 10_000;
    this.pollIntervalMs = options.pollIntervalMs ?? 2_000;
    this.pollMaxIntervalMs = options.pollMaxIntervalMs ?? 15_000;
    this.approvalTimeoutMs = options.approvalTimeoutMs ?? 300_000;
    this.heartbeatIntervalMs = options.heartbeatIntervalMs ?? null;
    this.onWaiting = options.onWaiting ?? null;
    this.sleep = options.sleep ?? defaultSleep;
    this.clock = options.clock ?? (() => performance.now());
    this.fetchFn = options.fetch ?? globalThis.fetch;
    this.tokenDigest = createHash("sha256").update(this.token).digest("hex");
  }

  /** The effect's page in the console (the same server): where a person decides. */
  consoleUrl(effectId: string): string {
    return `${this.baseUrl}/effects/${effectId}/`;
  }

  // --- HTTP with retries -------------------------------------------------------------

  /** Exponential back-off with jitter: backoff·2^retry, halved at random, capped. */
  private delay(retry: number): number {
    const delay = Math.min(this.backoffMaxMs, this.backoffMs * 2 ** retry);
    return delay * (0.5 + Math.random() / 2);
  }

  /**
   * One logical request under `/api/v1`, retried safely; returns the answer below 400.
   *
   * 1. A `POST` gets an `Idempotency-Key` (`idempotencyKey` or a new UUID) that every
   *    retry repeats.
   * 2. A network error or a 5xx is retried after an exponential back-off, as is a
   *    `409 request_in_progress` (the first try is still being processed).
   * 3. A `429 rate_limited` is retried after the server's `Retry-After` (capped at
   *    `backoffMaxMs`, never shorter than the back-off).
   * 4. Any other 4xx throws its typed error at once; retries running out throw
   *    `ServiceUnavailable` (or `RequestInProgress`, `RateLimited`).
   */
  async request(method: string, path: string, options: RequestOptions = {}): Promise<Answer> {
    const headers: Record<string, string> = {
      Authorization: `Bearer ${this.token}`,
      Accept: "application/json",
      ...options.headers,
    };
    const upper = method.toUpperCase();
    if (upper === "POST") headers["Idempotency-Key"] = options.idempotencyKey ?? randomUUID();
    let body: string | undefined;
    if (options.json !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(options.json);
    }
    const url = new URL(this.baseUrl + API_PREFIX + path);
    for (const [name, value] of Object.entries(options.params ?? {})) {
      if (value !== null && value !== undefined) url.searchParams.set(name, String(value));
    }
    let lastError: StartsafeError | null = null;
    let waitAtLeast = 0; // the server's Retry-After, when it gave one
    for (let retry = 0; retry <= this.maxRetries; retry++) {
      if (retry) {
        await this.sleep(Math.max(this.delay(retry - 1), waitAtLeast));
        waitAtLeast = 0;
      }
      let status: number;
      let answerHeaders: Headers;
      let text: string;
      try {
        const response = await this.fetchFn(url, {
          method: upper,
          headers,
          body,
          signal: AbortSignal.timeout(this.timeoutMs),
        });
        status = response.status;
        answerHeaders = response.headers;
        text = await response.text(); // a connection lost mid-body is a network error too
      } catch (error) {
        const { name, text: why } = describe(error);
        lastError = new ServiceUnavailable(`${upper} ${path}: ${why}`, { details: { exception: name } });
        continue;
      }
      if (status >= 500) {
        lastError = new ServiceUnavailable(`${upper} ${path}: the server answered ${status}`, { status });
        continue;
      }
      if (status >= 400) {
        const error = errorFromAnswer(status, parseBody(text));
        if (error instanceof RequestInProgress) {
          lastError = error;
          continue;
        }
        if (error instanceof RateLimited) {
          waitAtLeast = Math.min(this.backoffMaxMs, retryAfterMs(answerHeaders));
          lastError = error;
          continue;
        }
        throw error;
      }
      return { status, headers: answerHeaders, body: parseBody(text) };
    }
    throw lastError as StartsafeError;
  }

  /** `GET` a path under `/api/v1` and return its JSON body. */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  async get(path: string, params: RequestOptions["params"] = {}): Promise<any> {
    return (await this.request("GET", path, { params })).body;
  }

  /** `POST` a JSON body to a path under `/api/v1` and return its JSON answer. */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  async post(path: string, body: unknown): Promise<any> {
    return (await this.request("POST", path, { json: body })).body;
  }

  /** `GET /runs/{id}`: the run, its attempts, verdict, journal and effects. */
  getRun(runId: string): Promise<Record<string, unknown>> {
    return this.get(`/runs/${runId}`);
  }

  /** `GET /effects/{id}`: `{effect, action}`. */
  getEffect(effectId: string): Promise<{ effect: Effect; action: string }> {
    return this.get(`/effects/${effectId}`);
  }

  /** `GET /effects` with filters (`run_id`, `status`, `key`, `tool`…). */
  listEffects(filters: RequestOptions["params"] = {}): Promise<{ items: Effect[]; next_cursor: string | null }> {
    return this.get("/effects", filters);
  }

  /**
   * One approval poll with `If-None-Match`: `null` when nothing changed (`304`), else
   * the answer `{effect, action}`, with the new `ETag`.
   */
  async pollEffect(
    effectId: string,
    etag: string | null,
  ): Promise<{ answer: { effect: Effect; action: string } | null; etag: string }> {
    const headers: Record<string, string> = etag ? { "If-None-Match": etag } : {};
    const response = await this.request("GET", `/effects/${effectId}`, { headers });
    if (response.status === 304) return { answer: null, etag: etag ?? "" };
    return { answer: response.body, etag: response.headers.get("ETag") ?? "" };
  }

  // --- Tools and their declarations (api.md, POST /tools) -----------------------------

  /**
   * Declare a tool once: its name in the journal, its spec ({@link read} or
   * {@link effect}) and the function doing the work, which receives the arguments to
   * run with as one object. Call it with `run.call(tool, args)`.
   */
  tool<A extends Args = Args, R = unknown>(name: string, spec: ToolSpec<A>, fn: ToolFunction<A, R>): Tool<A, R> {
    if (!(spec instanceof ToolSpec)) {
      throw new TypeError(`tool ${JSON.stringify(name)}: declare it with read() or effect()`);
    }
    if (typeof fn !== "function") throw new TypeError(`tool ${JSON.stringify(name)}: give the function that does the work`);
    this.adopt([spec.declaration(name)]);
    return new Tool(name, spec, fn);
  }

  /**
   * Declare tools now (`POST /api/v1/tools`); returns the server's Tool objects. `tools`:
   * the tools `client.tool` made, or specs by name; `schemas`: each tool's argument JSON
   * Schema by name, where known. A run declares this client's tools by itself before its
   * first call, once per process, so this is needed only to declare early or with schemas.
   */
  async declareTools(
    tools: Tool<never, unknown>[] | Record<string, ToolSpec<never>>,
    schemas: Record<string, Record<string, unknown>> = {},
  ): Promise<Record<string, unknown>[]> {
    const named: [string, ToolSpec<never>][] = Array.isArray(tools)
      ? tools.map((tool) => [tool.name, tool.spec])
      : Object.entries(tools);
    const declarations = this.adopt(named.map(([name, spec]) => spec.declaration(name, schemas[name] ?? null)));
    return (await this.serialized(() => this.declare(declarations, false))).tools;
  }

  /**
   * @internal Make these declarations this client's (sent before its next call);
   * `replace: false` keeps a tool's declaration already known (a call's spec does not
   * undo an adapter's, which has the schema). Adapters adopt their tools' declarations
   * with the schemas.
   */
  adopt(declarations: Record<string, unknown>[], replace = true): Record<string, unknown>[] {
    const adopted = [];
    for (const declared of declarations) {
      const name = String(declared["name"]);
      if (!replace && this.declarations.has(name)) continue;
      this.declarations.set(name, { declared, digest: canonicalJson(declared) });
      adopted.push(declared);
    }
    return adopted;
  }

  private sentKey(name: string, digest: string): string {
    return JSON.stringify([this.baseUrl, this.tokenDigest, name, digest]);
  }

  private serialized<T>(work: () => Promise<T>): Promise<T> {
    const next = declaring.then(work, work);
    declaring = next.catch(() => undefined);
    return next;
  }

  /** @internal Before a call: the tool joins this client's tools, and what the process has not sent is declared. */
  async declareBefore(name: string, spec: ToolSpec<never>): Promise<void> {
    this.adopt([spec.declaration(name)], false);
    const pending = () =>
      [...this.declarations.entries()].filter(([toolName, { digest }]) => !DECLARED.has(this.sentKey(toolName, digest)));
    if (pending().length === 0) return;
    await this.serialized(async () => {
      const waiting = pending().map(([, { declared }]) => declared);
      if (waiting.length === 0) return;
      const declared = await this.declare(waiting, true);
      if (declared.refused.length) {
        console.warn(
          `startsafe: the agent's closed mode refused to register ${declared.refused.join(", ")}: an admin ` +
            `registers them on the tools page (${this.baseUrl}/tools/); until then their calls are refused`,
        );
      }
      if (!declared.registry) {
        console.warn("startsafe: POST /api/v1/tools answered 404: this server has no tool registry, so the tools are not declared");
      }
    });
  }

  /**
   * `POST /tools` in batches of 500, with the client's retries; then the process counts
   * them as sent. When `lenient` (a run's own declaration before its first call): a tool
   * the `closed` mode refuses is left out (its own call is refused with
   * `409 tool_not_registered`), and a server without a registry (404) is declared nothing.
   */
  private async declare(
    declarations: Record<string, unknown>[],
    lenient: boolean,
  ): Promise<{ tools: Record<string, unknown>[]; refused: string[]; registry: boolean }> {
    const answered: Record<string, unknown>[] = [];
    const refused: string[] = [];
    let registry = true;
    for (let start = 0; start < declarations.length && registry; start += DECLARE_BATCH) {
      let batch = declarations.slice(start, start + DECLARE_BATCH);
      while (batch.length) {
        try {
          const answer = await this.post("/tools", { tools: batch });
          answered.push(...((answer?.tools as Record<string, unknown>[] | undefined) ?? []));
          break;
        } catch (error) {
          const names = batch.map((declared) => String(declared["name"]));
          if (lenient && error instanceof ToolNotRegistered && error.tool !== null && names.includes(error.tool)) {
            // The server names one refused tool per answer: keep those the agent has
            // registered (one listing, not a try per tool), never the one it named.
            const registered = await this.registered();
            registered.delete(error.tool);
            refused.push(...names.filter((name) => !registered.has(name)));
            batch = batch.filter((declared) => registered.has(String(declared["name"])));
            continue;
          }
          if (lenient && error instanceof StartsafeError && error.status === 404) {
            registry = false;
            break;
          }
          throw error;
        }
      }
    }
    for (const declared of declarations) {
      DECLARED.add(this.sentKey(String(declared["name"]), canonicalJson(declared)));
    }
    return { tools: answered, refused, registry };
  }

  /** The names of the agent's registered tools (`GET /tools`, every page). */
  private async registered(): Promise<Set<string>> {
    const names = new Set<string>();
    let cursor: string | null = null;
    do {
      const page: { items?: { name: string }[]; next_cursor?: string | null } = await this.get("/tools", {
        limit: 200,
        cursor,
      });
      for (const tool of page.items ?? []) names.add(tool.name);
      cursor = page.next_cursor ?? null;
    } while (cursor);
    return names;
  }

  // --- Running ------------------------------------------------------------------------

  /**
   * Start the run (or start it again), heartbeat while `fn` runs, and always finish the
   * attempt: `completed` when `fn` returns, `failed` with the error when it throws (the
   * error is thrown on). An `AttemptStopped` (superseded, or the run finished) finishes
   * nothing: the attempt is no longer this process's. Returns what `fn` returns.
   */
  run<T>(runKey: string, fn: (run: Run) => Promise<T>): Promise<T>;
  run<T>(runKey: string, options: RunOptions, fn: (run: Run) => Promise<T>): Promise<T>;
  async run<T>(
    runKey: string,
    optionsOrFn: RunOptions | ((run: Run) => Promise<T>),
    maybeFn?: (run: Run) => Promise<T>,
  ): Promise<T> {
    const [options, fn] = typeof optionsOrFn === "function" ? [{}, optionsOrFn] : [optionsOrFn, maybeFn];
    if (typeof fn !== "function") throw new TypeError("client.run takes the run's function as its last argument");
    const run = new Run(this, runKey, options);
    await run.start();
    run.startHeartbeats(this.heartbeatIntervalMs);
    let value: T;
    try {
      value = await fn(run);
    } catch (error) {
      await run.stopHeartbeats();
      await run.leave(true, error);
      throw error;
    }
    await run.stopHeartbeats();
    await run.leave(false);
    return value;
  }
}
