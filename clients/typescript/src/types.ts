/** The shapes of the API's objects (api.md), as far as the client reads them. */

export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };
export type JsonObject = { [key: string]: JsonValue };

/**
 * A tool's arguments: a JSON object the model generated. Its fields are `any` by
 * default, so a key rule reads them without casts; give a tool its own type to check.
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Args = Record<string, any>;
/** An effect's result: a JSON object. */
export type Result = Record<string, unknown>;

/** What the agent must do now (api.md, "Action"). */
export type Action = "execute" | "claim" | "skip" | "wait" | "review" | "blocked";

export interface Decision {
  verb?: string;
  by?: string;
  at?: string;
  note?: string;
  args_hash?: string;
  final?: boolean;
}

/** An effect as the API shows it; fields the client does not read stay as they came. */
export interface Effect {
  id: string;
  run_id?: string;
  tool?: string;
  key?: string | null;
  key_source?: string | null;
  status?: string;
  args?: Args;
  args_hash?: string;
  result?: Result | null;
  decision?: Decision | null;
  [field: string]: unknown;
}

/** One line of a run's journal. */
export interface Call {
  id: string;
  attempt: number;
  seq: number;
  tool: string;
  kind: "read" | "effect";
  args_hash: string;
  action: Action;
  effect_id: string | null;
  [field: string]: unknown;
}

/** The answer of `POST /runs/{id}/calls`. */
export interface CallAnswer {
  call: Call;
  action: Action;
  effect: Effect | null;
}

/** The answer of a poll, a claim or a reconcile. */
export interface EffectAnswer {
  effect: Effect;
  action: Action;
}
