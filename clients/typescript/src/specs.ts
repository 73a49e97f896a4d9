/**
 * Declarations beside the tools: a read, or an effect with its key rule and approvals.
 *
 * ```ts
 * const specs = {
 *   lookup_customer: read(),
 *   send_reply: effect({
 *     key: (a) => providerKey("outlook", "message", a.message_id),
 *     reconcile: findReplyInSentItems,
 *   }),
 *   send_campaign: effect({
 *     key: (a) => intentKey("campaign", { campaign_id: a.campaign_id }),
 *     approval: "required",
 *     approvers: 2,
 *   }),
 * };
 * ```
 *
 * A spec says what a tool *is*, never how it runs: `client.tool(name, spec, fn)` pairs
 * it with a function (a {@link Tool}), and a framework adapter pairs it with the
 * framework's own tool through `run.callSpec`. (startsafe_client/specs.py, in TypeScript.)
 */

import { KeyRefused, NotPerformed } from "./errors.js";
import { Key } from "./keys.js";
import type { Args, Effect, Result } from "./types.js";

export const MAX_PREVIEW_TEXT = 4000;

/**
 * What a reconcile lookup found at the provider: {@link Reconciliation.done} or
 * {@link Reconciliation.notDone}; a lookup that cannot tell returns `null` instead.
 *
 * **Only a lookup that sees the provider's latest state may answer `notDone`.** It
 * releases the effect so it runs again; a search index that lags behind would release
 * an effect that happened, and it would happen twice. When in doubt, return `null` and
 * let a person decide.
 */
export class Reconciliation {
  private constructor(
    readonly outcome: "done" | "not_done",
    readonly evidence: string,
    readonly result: Result | null,
  ) {
    if (typeof evidence !== "string" || !evidence.trim()) {
      throw new RangeError("a reconciliation needs evidence: what was looked up and found");
    }
  }

  /** It happened: `evidence` says what was looked up and found. */
  static done(evidence: string, result?: Result | null): Reconciliation {
    return new Reconciliation("done", evidence, result ?? null);
  }

  /** It did not happen (an authoritative, up-to-date lookup only: see the class doc). */
  static notDone(evidence: string): Reconciliation {
    return new Reconciliation("not_done", evidence, null);
  }
}

/** `(args, effect) => Reconciliation | null`: the effect's recorded args, and the effect. */
export type ReconcileLookup<A = Args> = (
  args: A,
  effect: Effect,
) => Reconciliation | null | Promise<Reconciliation | null>;

export type KeyRule<A = Args> = (args: A) => Key | Promise<Key>;

/** An error class a tool throws only before anything was sent. */
export type ErrorClass = abstract new (...args: never[]) => Error;

export interface EffectOptions<A = Args> {
  /**
   * `args => Key` from stable intent (providerKey, contentKey, contentKeyOfFile,
   * intentKey); none makes an unkeyed effect (allowed, but it blocks automatic restarts).
   */
  key?: KeyRule<A>;
  /** `"required"`: a person approves each effect before it runs. */
  approval?: "required" | "none";
  /** How many distinct operators approve (1–3; with `approval: "required"`). */
  approvers?: 1 | 2 | 3;
  /** Seconds an approval request stays open (60–2,592,000; the server's default). */
  approvalTtl?: number;
  /** Seconds after which an effect still in flight becomes unknown (1–86,400). */
  timeout?: number;
  /** The text shown to the approving person (at most 4,000 characters). */
  preview?: string | ((args: A) => string);
  /** Looks the effect up at the provider when its outcome is unknown. */
  reconcile?: ReconcileLookup<A>;
  /** Error classes the tool throws only before anything was sent: reported failed. */
  notPerformed?: readonly ErrorClass[];
}

/** How a tool is journaled; made by {@link read} or {@link effect}. */
export class ToolSpec<A = Args> {
  readonly kind: "read" | "effect";
  readonly key: KeyRule<A> | null;
  readonly needsApproval: boolean;
  readonly approvalsRequired: number;
  readonly approvalTtl: number | null;
  readonly timeout: number | null;
  readonly preview: string | ((args: A) => string) | null;
  readonly reconcile: ReconcileLookup<A> | null;
  readonly notPerformed: readonly ErrorClass[];

  constructor(kind: "read" | "effect", options: EffectOptions<A> = {}) {
    if (kind !== "read" && kind !== "effect") throw new RangeError("kind must be 'read' or 'effect'");
    if (options.approval !== undefined && options.approval !== "required" && options.approval !== "none") {
      throw new RangeError("approval must be 'required' or 'none'");
    }
    this.kind = kind;
    this.key = options.key ?? null;
    this.needsApproval = options.approval === "required";
    this.approvalsRequired = options.approvers ?? 1;
    this.approvalTtl = options.approvalTtl ?? null;
    this.timeout = options.timeout ?? null;
    this.preview = options.preview ?? null;
    this.reconcile = options.reconcile ?? null;
    this.notPerformed = [...(options.notPerformed ?? [])];
    if (![1, 2, 3].includes(this.approvalsRequired)) throw new RangeError("approvers must be 1, 2 or 3");
    if (this.approvalsRequired > 1 && !this.needsApproval) {
      throw new RangeError("approvers needs approval: 'required'");
    }
  }

  /**
   * The key for these arguments (`null` for reads and unkeyed effects). Throws
   * {@link KeyRefused} when the rule found no key (a missing, empty or blank field, a
   * file it cannot read): the call must not be recorded.
   */
  async keyFor(tool: string, args: A): Promise<Key | null> {
    if (this.key === null) return null;
    let key: unknown;
    try {
      key = await this.key(args);
    } catch (missing) {
      const why = missing instanceof Error ? `${missing.name}: ${missing.message}` : String(missing);
      throw new KeyRefused(
        `${tool}: no key in these arguments (${why}); a key is never built from nothing, so the call was not made`,
        { details: { tool }, cause: missing },
      );
    }
    if (key === null || key === undefined) {
      throw new KeyRefused(`${tool}: the key rule found no key in these arguments; the call was not made`, {
        details: { tool },
      });
    }
    if (!(key instanceof Key)) {
      throw new TypeError(
        `tool ${JSON.stringify(tool)}: the key rule must return a Key (use providerKey, contentKey or intentKey)`,
      );
    }
    return key;
  }

  /** The preview text for these arguments, if the spec declares one. */
  previewFor(args: A): string | null {
    if (this.preview === null) return null;
    const text = typeof this.preview === "string" ? this.preview : this.preview(args);
    return String(text).slice(0, MAX_PREVIEW_TEXT);
  }

  /** The tool's declaration as `POST /api/v1/tools` takes it (api.md, "Additions in v1"). */
  declaration(name: string, schema?: Record<string, unknown> | null): Record<string, unknown> {
    const declared: Record<string, unknown> = { name, kind: this.kind };
    if (this.needsApproval) {
      declared["needs_approval"] = true;
      declared["approvals_required"] = this.approvalsRequired;
    }
    if (schema) declared["schema"] = schema;
    return declared;
  }

  /** Whether the tool's error says that nothing was sent (so report `failed`). */
  performedNothing(error: unknown): boolean {
    return error instanceof NotPerformed || this.notPerformed.some((cls) => error instanceof cls);
  }
}

/** A read: journaled, never gated, run again on every call. */
export function read<A = Args>(): ToolSpec<A> {
  return new ToolSpec<A>("read");
}

/**
 * An effect: recorded before it runs, executed once per key. `key` receives the
 * arguments the model generated and builds the key from stable intent only. A
 * reconcile lookup receives the effect's recorded arguments and the effect.
 */
export function effect<A = Args>(options: EffectOptions<A> = {}): ToolSpec<A> {
  return new ToolSpec<A>("effect", options);
}

/** A tool's function: it receives the arguments to run with, as one object. */
export type ToolFunction<A = Args, R = unknown> = (args: A) => R | Promise<R>;

/**
 * A function paired with its spec, made by `client.tool`; call it with `run.call`, so
 * it is recorded before it is made.
 */
export class Tool<A = Args, R = unknown> {
  constructor(
    readonly name: string,
    readonly spec: ToolSpec<A>,
    readonly fn: ToolFunction<A, R>,
  ) {}

  get kind(): "read" | "effect" {
    return this.spec.kind;
  }
}

/**
 * A tool's return value as the effect's result object: `undefined`/`null` → `{}`, an
 * object as it is, anything else → `{value}`.
 */
export function asResult(value: unknown): Result {
  if (value === null || value === undefined) return {};
  if (typeof value === "object" && !Array.isArray(value)) return value as Result;
  return { value };
}

/** The value a tool returned, from its recorded result (the inverse of {@link asResult}). */
export function fromResult(result: Result): unknown {
  const names = Object.keys(result);
  if (names.length === 1 && names[0] === "value") return result["value"];
  return result;
}
