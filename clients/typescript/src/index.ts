/**
 * startsafe-client: journal an agent's tool calls with startsafe, keyed by stable intent.
 *
 * ```ts
 * import { Client, effect, providerKey } from "startsafe-client";
 *
 * const client = new Client({ baseUrl: "http://127.0.0.1:8000", token });
 * const sendReply = client.tool(
 *   "send_reply",
 *   effect({ key: (a) => providerKey("outlook", "message", a.message_id) }),
 *   async (a) => mail.send(a),
 * );
 * await client.run("ticket-4812", { supersede: "stale" }, async (run) => {
 *   await run.call(sendReply, { message_id: id, body: text });
 * });
 * ```
 *
 * **An error is not proof that nothing happened**: an effect's tool that throws leaves
 * the effect's outcome unknown (not reported); only {@link NotPerformed} reports it
 * `failed` so that it runs again.
 *
 * For framework adapters: declare tools with {@link read} / {@link effect}, journal each
 * call with `run.callSpec(name, spec, args, perform)`, and hand `forModel` of the errors
 * it throws back to the model. The same concepts and behaviour as the Python client
 * (startsafe_client); the shared vectors in clients/vectors/ hold both to them.
 */

export { argsHash, canonicalJson } from "./canonical.js";
export { API_PREFIX, Client } from "./client.js";
export type { Answer, ClientOptions, RequestOptions, Waiting } from "./client.js";
export {
  AlreadyRunning,
  ApprovalTimeout,
  AttemptStopped,
  AttemptSuperseded,
  ClaimConflict,
  EffectBlocked,
  EffectError,
  ERRORS_BY_CODE,
  IdempotencyKeyReused,
  InvalidRequest,
  KeyConflict,
  KeyRefused,
  NotFound,
  NotPerformed,
  OutcomeUnknown,
  PayloadTooLarge,
  RateLimited,
  RequestInProgress,
  RestartBlocked,
  RunFinished,
  ServiceUnavailable,
  StartsafeError,
  ToolNotRegistered,
  Unauthorized,
  errorFromAnswer,
} from "./errors.js";
export type { EffectErrorOptions, ErrorOptions } from "./errors.js";
export { Key, KEY_SOURCES, MAX_KEY_LENGTH, contentKey, contentKeyOfFile, intentKey, providerKey } from "./keys.js";
export type { KeySource } from "./keys.js";
export { Run } from "./run.js";
export type { RunOptions } from "./run.js";
export { Reconciliation, Tool, ToolSpec, asResult, effect, fromResult, read } from "./specs.js";
export type { EffectOptions, ErrorClass, KeyRule, ReconcileLookup, ToolFunction } from "./specs.js";
export type { Action, Args, Call, CallAnswer, Decision, Effect, EffectAnswer, JsonObject, JsonValue, Result } from "./types.js";
