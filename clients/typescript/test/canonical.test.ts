/**
 * Canonical JSON (RFC 8785) and args_hash against the shared vectors
 * (clients/vectors/canonical.json), whose digests are literals computed outside the
 * project: the same ones the server's tests check (tests/test_args_hash_vectors.py).
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { argsHash, canonicalJson } from "startsafe-client";

const CANONICAL = JSON.parse(readFileSync(new URL("../../vectors/canonical.json", import.meta.url), "utf8"));
const VECTORS: { name: string; args_json: string; canonical: string; sha256: string }[] = [
  ...CANONICAL.args_hash,
  ...CANONICAL.api_bodies,
];

test("every canonical vector is run here", () => {
  assert.equal(VECTORS.length, 8);
});

for (const vector of VECTORS) {
  test(`args_hash is the SHA-256 of the RFC 8785 canonical JSON: ${vector.name}`, () => {
    const args = JSON.parse(vector.args_json);
    assert.equal(canonicalJson(args), vector.canonical);
    assert.equal(argsHash(args), vector.sha256);
  });
}

test("canonical JSON refuses what JSON cannot hold", () => {
  assert.throws(() => canonicalJson({ n: Number.NaN }), TypeError);
  assert.throws(() => canonicalJson({ n: Infinity }), TypeError);
  assert.throws(() => canonicalJson({ n: 1n }), TypeError);
});

test("canonical JSON leaves out undefined fields, as JSON.stringify does when the body is sent", () => {
  assert.equal(canonicalJson({ b: undefined, a: [1, "x"] }), '{"a":[1,"x"]}');
});
