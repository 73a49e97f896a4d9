/**
 * Typed errors: one per error code of the API contract, plus the agent-side outcomes.
 *
 * Every error is a {@link StartsafeError} with `code`, `status` (the HTTP status, or
 * `null` when no single answer caused it), `message`, `details` and `forModel` (the
 * text a framework adapter hands back to the model). The classes and what to do about
 * each are the Python client's (startsafe_client/errors.py), name for name.
 *
 * One error goes the other way: {@link NotPerformed} is thrown by a *tool*, to say
 * that it sent nothing (so the effect is reported `failed` and may run again). Any
 * other error from an effect's tool is not proof that nothing happened: the client
 * does not report it, and the effect's outcome stays unknown until the next attempt
 * reconciles it or a person decides.
 */

import type { Effect, JsonObject } from "./types.js";

export interface ErrorOptions {
  code?: string;
  status?: number | null;
  details?: JsonObject;
  cause?: unknown;
}

/** A text field of an error's details, or `null`. */
function text(details: JsonObject, name: string): string | null {
  const value = details[name];
  return typeof value === "string" ? value : null;
}

/** A number field of an error's details, or `null`. */
function number(details: JsonObject, name: string): number | null {
  const value = details[name];
  return typeof value === "number" ? value : null;
}

/** Base of every error the client throws. */
export class StartsafeError extends Error {
  /** The contract's error code (`"already_running"`…) or the client's own. */
  readonly code: string;
  /** The HTTP status of the answer that caused it, or `null`. */
  readonly status: number | null;
  /** The answer's `error.details` (or the client's own details). */
  readonly details: JsonObject;

  /** The code of the class: each subclass names its own. */
  static readonly code: string = "error";

  constructor(message: string, options: ErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = options.code ?? (new.target as typeof StartsafeError).code;
    this.status = options.status ?? null;
    this.details = options.details ?? {};
  }

  /** The error as the text a framework adapter hands back to the model. */
  get forModel(): string {
    return this.message;
  }

  override toString(): string {
    const where = this.status ? ` (HTTP ${this.status})` : "";
    return `${this.code}${where}: ${this.message}`;
  }
}

// --- The contract's error codes ------------------------------------------------

/** 400: malformed or out-of-range input; `fields` names each field. */
export class InvalidRequest extends StartsafeError {
  static override readonly code = "invalid_request";
  /** Each wrong field and what is wrong with it. */
  get fields(): JsonObject {
    return (this.details["fields"] as JsonObject | undefined) ?? {};
  }
}

/** 401: no token, an unknown token, or a deactivated agent. */
export class Unauthorized extends StartsafeError {
  static override readonly code = "unauthorized";
}

/** 404: no such object for this agent (another agent's ids answer the same). */
export class NotFound extends StartsafeError {
  static override readonly code = "not_found";
}

/** 409: the run has a live attempt; `attempt` and `heartbeatAt` help judge it. */
export class AlreadyRunning extends StartsafeError {
  static override readonly code = "already_running";
  /** The run's current attempt number. */
  get attempt(): number | null {
    return number(this.details, "attempt");
  }
  /** When that attempt last heartbeat (ISO 8601). */
  get heartbeatAt(): string | null {
    return text(this.details, "heartbeat_at");
  }
}

/** 409: the verdict says the restart is not safe; `verdict` says why. */
export class RestartBlocked extends StartsafeError {
  static override readonly code = "restart_blocked";
  get verdict(): JsonObject {
    return (this.details["verdict"] as JsonObject | undefined) ?? {};
  }
}

/** This attempt may no longer act: it was superseded, or the run is finished. */
export class AttemptStopped extends StartsafeError {}

/** 409: the run is `completed` or `abandoned`. */
export class RunFinished extends AttemptStopped {
  static override readonly code = "run_finished";
}

/** 409: this attempt is no longer the run's current running attempt: stop. */
export class AttemptSuperseded extends AttemptStopped {
  static override readonly code = "attempt_superseded";
}

/** 409: the key already belongs to another tool (`tool` names it). */
export class KeyConflict extends StartsafeError {
  static override readonly code = "key_conflict";
  get tool(): string | null {
    return text(this.details, "tool");
  }
}

/** 409: under the agent's `closed` mode, `tool` is not registered: an admin adds it. */
export class ToolNotRegistered extends StartsafeError {
  static override readonly code = "tool_not_registered";
  get tool(): string | null {
    return text(this.details, "tool");
  }
}

/** 409: this attempt cannot hold the effect now; `effectStatus` is its status. */
export class ClaimConflict extends StartsafeError {
  static override readonly code = "claim_conflict";
  get effectStatus(): string | null {
    return text(this.details, "status");
  }
}

/** 409: the same `Idempotency-Key` is still being processed (retried by the client). */
export class RequestInProgress extends StartsafeError {
  static override readonly code = "request_in_progress";
}

/** 422: the `Idempotency-Key` was used before with a different body: a client bug. */
export class IdempotencyKeyReused extends StartsafeError {
  static override readonly code = "idempotency_key_reused";
}

/** 413: the body is over 1 MiB, or `input`/`args`/`result` over 256 KiB. */
export class PayloadTooLarge extends StartsafeError {
  static override readonly code = "payload_too_large";
}

/** 429: too many requests; retried after `Retry-After`, thrown once retries ran out. */
export class RateLimited extends StartsafeError {
  static override readonly code = "rate_limited";
  /** The server's last advice, in seconds. */
  get retryAfter(): number | null {
    return number(this.details, "retry_after");
  }
}

/** Network errors or 5xx answers outlasted the retries (`status` is the last 5xx). */
export class ServiceUnavailable extends StartsafeError {
  static override readonly code = "unavailable";
}

const ERROR_CLASSES = [
  InvalidRequest,
  Unauthorized,
  NotFound,
  AlreadyRunning,
  RestartBlocked,
  RunFinished,
  AttemptSuperseded,
  KeyConflict,
  ToolNotRegistered,
  ClaimConflict,
  RequestInProgress,
  IdempotencyKeyReused,
  PayloadTooLarge,
  RateLimited,
] as const;

/** The error class of each code of the contract. */
export const ERRORS_BY_CODE: Readonly<Record<string, typeof StartsafeError>> = Object.freeze(
  Object.fromEntries(ERROR_CLASSES.map((cls) => [cls.code, cls])),
);

function isObject(value: unknown): value is JsonObject {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** The typed error for an error answer `{"error": {code, message, details}}`. */
export function errorFromAnswer(status: number, body: unknown): StartsafeError {
  const error = isObject(body) ? body["error"] : undefined;
  if (!isObject(error)) {
    const text = typeof body === "string" ? body : JSON.stringify(body);
    return new StartsafeError(`Unexpected answer without an error body: ${String(text).slice(0, 200)}`, {
      code: "unexpected",
      status,
    });
  }
  const code = String(error["code"] || "error");
  const message = String(error["message"] || code);
  const details = isObject(error["details"]) ? error["details"] : {};
  const cls = ERRORS_BY_CODE[code] ?? StartsafeError;
  return new cls(message, { code, status, details });
}

// --- What a tool call can end in -------------------------------------------------

/**
 * Thrown by a tool to say that it sent nothing: the effect did not happen.
 *
 * **An error is not proof that nothing happened.** A tool that sent the e-mail and
 * then timed out reading the answer did the effect, so the client never reports an
 * ordinary error from an effect's tool: the effect stays in flight, becomes `unknown`
 * when the attempt ends, and the next attempt reconciles it (or a person decides).
 * Only `NotPerformed` (or an error class the spec lists in `notPerformed`) is reported
 * `failed`, so the next call of that key runs the tool again. Throw it only where
 * nothing can have left the process yet.
 */
export class NotPerformed extends Error {
  constructor(message = "not performed", options?: { cause?: unknown }) {
    super(message, options);
    this.name = "NotPerformed";
  }
}

/** The key rule found no key in these arguments: the call was refused, nothing recorded. */
export class KeyRefused extends StartsafeError {
  static override readonly code = "key_refused";
  get tool(): string | null {
    return text(this.details, "tool");
  }
}

export interface EffectErrorOptions extends ErrorOptions {
  effect: Effect;
  url?: string;
}

/** Base of the outcomes of a tool call that mean "do not perform it now". */
export class EffectError extends StartsafeError {
  /** The effect as last seen (shaped like the API's Effect). */
  readonly effect: Effect;
  /** Its page in the console, where a person decides. */
  readonly url: string;

  constructor(message: string, options: EffectErrorOptions) {
    super(message, options);
    this.effect = options.effect;
    this.url = options.url ?? "";
  }

  get effectId(): string | null {
    return typeof this.effect.id === "string" ? this.effect.id : null;
  }

  get tool(): string {
    return String(this.effect.tool ?? "");
  }
}

/** The effect was rejected or its approval expired: never perform it. */
export class EffectBlocked extends EffectError {
  static override readonly code = "effect_blocked";

  /** The decision's note, written for the model (empty for an expiry without one). */
  get note(): string {
    return String(this.effect.decision?.note ?? "");
  }

  /** True when the rejection was final: no revision can ask again. */
  get final(): boolean {
    return Boolean(this.effect.decision?.final);
  }

  /** `"rejected by an operator: <note>"` (or why it expired), for the model. */
  override get forModel(): string {
    let head: string;
    if (this.effect.status === "expired") {
      head = "not performed: nobody approved it in time";
    } else {
      head = "rejected by an operator";
      if (this.final) head += " (final: do not propose it again)";
    }
    return this.note ? `${head}: ${this.note}` : head;
  }
}

/** The bounded wait ran out while the effect still waited: nothing was performed. */
export class ApprovalTimeout extends EffectError {
  static override readonly code = "approval_timeout";

  override get forModel(): string {
    return (
      `not performed yet: it waits (${String(this.effect.status)}) for a person's ` +
      `decision at ${this.url}`
    );
  }
}

/** The effect may or may not have happened and the client cannot tell. */
export class OutcomeUnknown extends EffectError {
  static override readonly code = "outcome_unknown";

  override get forModel(): string {
    return `it may or may not have happened; do not try it again: a person decides at ${this.url}`;
  }
}
