/**
 * RFC 8785 canonical JSON (JCS) and `args_hash`, as the server computes them (api.md:
 * "args_hash is the SHA-256 (lowercase hex) of the RFC 8785 canonical JSON of args").
 *
 * Written here rather than taken from npm: RFC 8785 was designed so that ECMAScript
 * does most of it. `JSON.stringify` of a number is the RFC's number form (section
 * 3.2.2.3 is ECMAScript's Number::toString) and of a string its escaping (3.2.2.2);
 * what is left is sorting names by UTF-16 code units (3.2.3), which is what `<` on
 * JavaScript strings compares. The RFC author's `canonicalize` does the same in as
 * many lines, but its current major version needs Node 22 while this package
 * supports Node 20. The shared vectors (clients/vectors/canonical.json) hold it to
 * the server's digests.
 */

import { createHash } from "node:crypto";

/** The canonical JSON text of a value (RFC 8785); throws on what JSON cannot hold. */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value === "boolean" || typeof value === "string") {
    return JSON.stringify(value);
  }
  if (typeof value === "number") {
    if (!Number.isFinite(value)) {
      throw new TypeError(`canonical JSON has no form for ${value}`);
    }
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) {
    return `[${value.map((item) => canonicalJson(item)).join(",")}]`;
  }
  if (typeof value === "object") {
    // A Date, a Map…: JSON.stringify's own conversion first (toJSON), as a body would be sent.
    const json = (value as { toJSON?: () => unknown }).toJSON;
    if (typeof json === "function") return canonicalJson(json.call(value));
    const entries = Object.entries(value as Record<string, unknown>).filter(
      ([, item]) => item !== undefined && typeof item !== "function",
    );
    entries.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([name, item]) => `${JSON.stringify(name)}:${canonicalJson(item)}`).join(",")}}`;
  }
  throw new TypeError(`canonical JSON has no form for a ${typeof value}`);
}

/** The SHA-256 (lowercase hex) of the canonical JSON of `args`: the API's `args_hash`. */
export function argsHash(args: unknown): string {
  return createHash("sha256").update(canonicalJson(args), "utf8").digest("hex");
}
