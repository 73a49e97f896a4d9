/**
 * Idempotency keys from stable intent: the three sources, and nothing else.
 *
 * A key says *what* an effect is about to do, so that a replay of the run (where the
 * model may have rewritten every argument) lands on the same key and is skipped. It
 * must come from stable intent, **never from generated content**.
 *
 * - {@link providerKey}: the provider's identity of the thing acted on
 *   (`outlook:message:<internetMessageId>`);
 * - {@link contentKey} / {@link contentKeyOfFile}: a SHA-256 of the content
 *   (`sha256:9f86d0…`);
 * - {@link intentKey}: named stable fields the tool declares (`campaign:2026-winter-eu`).
 *
 * Every helper refuses to build a key from nothing: an empty, blank, `null` or
 * `undefined` part throws, never a key like `"outlook:message:"` that every call would
 * share. (The Python client's startsafe_client/keys.py, rule for rule.)
 */

import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";

export const KEY_SOURCES = ["provider", "content", "intent"] as const;
export type KeySource = (typeof KEY_SOURCES)[number];
export const MAX_KEY_LENGTH = 255;

// Python's str.isprintable(): no control, format, unassigned or separator character
// except the ASCII space (the API takes keys of printable characters only).
const NOT_PRINTABLE = /(?! )[\p{C}\p{Z}]/u;

/** An idempotency key and where it came from. */
export class Key {
  constructor(
    readonly value: string,
    readonly source: KeySource,
  ) {
    if (!(KEY_SOURCES as readonly string[]).includes(source)) {
      throw new RangeError(`key source must be one of ${KEY_SOURCES.join(", ")}, not ${JSON.stringify(source)}`);
    }
    if (typeof value !== "string" || !value || NOT_PRINTABLE.test(value)) {
      throw new RangeError("a key must be non-empty printable text");
    }
    const length = [...value].length;
    if (length > MAX_KEY_LENGTH) {
      throw new RangeError(`a key is at most ${MAX_KEY_LENGTH} characters (${length})`);
    }
  }

  toString(): string {
    return this.value;
  }
}

/** One part of a key, as text; refuses `null`, `undefined`, empty and blank values. */
function part(name: string, value: unknown): string {
  let text: string;
  if (typeof value === "string") {
    text = value.trim();
  } else if (typeof value === "number" || typeof value === "bigint") {
    if (typeof value === "number" && !Number.isFinite(value)) {
      throw new RangeError(`cannot build a key: ${name} is ${value}`);
    }
    text = String(value);
  } else if (value === null || value === undefined || typeof value === "boolean") {
    throw new RangeError(`cannot build a key: ${name} is ${String(value)}`);
  } else {
    throw new RangeError(`cannot build a key: ${name} must be text or a number, not ${typeof value}`);
  }
  if (!text) throw new RangeError(`cannot build a key: ${name} is empty`);
  return text;
}

/**
 * A key from the provider's own identity of the thing acted on:
 * `providerKey("outlook", "message", id)` is `outlook:message:<id>`.
 * Throws when any part is missing, empty or blank.
 */
export function providerKey(provider: string, kind: string, identity: string | number): Key {
  return new Key(`${part("provider", provider)}:${part("kind", kind)}:${part("identity", identity)}`, "provider");
}

/**
 * A key from the SHA-256 of the content (`sha256:<hex>`). Takes bytes (a Uint8Array
 * or a Buffer): encode text explicitly. Throws on empty content.
 */
export function contentKey(content: Uint8Array): Key {
  if (!(content instanceof Uint8Array)) {
    throw new TypeError("contentKey takes bytes (a Uint8Array or a Buffer); encode text explicitly");
  }
  if (content.length === 0) throw new RangeError("cannot build a key from empty content");
  return new Key(`sha256:${createHash("sha256").update(content).digest("hex")}`, "content");
}

/**
 * A key from the SHA-256 of a file's bytes, streamed through node:crypto.
 * Rejects when the file is empty or cannot be read.
 */
export async function contentKeyOfFile(path: string | URL): Promise<Key> {
  const digest = createHash("sha256");
  let size = 0;
  for await (const chunk of createReadStream(path) as AsyncIterable<Buffer>) {
    digest.update(chunk);
    size += chunk.length;
  }
  if (size === 0) throw new RangeError(`cannot build a key from an empty file: ${String(path)}`);
  return new Key(`sha256:${digest.digest("hex")}`, "content");
}

/**
 * A key from a name and named stable fields the tool declares:
 * `intentKey("campaign", { campaign_id: "2026-winter-eu" })` is
 * `campaign:2026-winter-eu`. With several fields their values follow in the order of
 * the field names, whatever order they are given in. Throws without fields, or when a
 * field is missing, empty or blank.
 */
export function intentKey(name: string, fields: Record<string, string | number>): Key {
  const names = Object.keys(fields ?? {}).sort();
  if (names.length === 0) throw new RangeError("an intent key needs at least one named field");
  return new Key([part("name", name), ...names.map((field) => part(field, fields[field]))].join(":"), "intent");
}
