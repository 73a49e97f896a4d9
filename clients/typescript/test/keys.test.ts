/** The key helpers: the three sources, each refusing to build a key from nothing. */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { Key, KeyRefused, contentKey, contentKeyOfFile, effect, intentKey, providerKey } from "startsafe-client";

test("a provider key names the provider, the kind and the identity", () => {
  const key = providerKey("outlook", "message", " <CAF-4812@mail.example.com> ");
  assert.deepEqual(key, new Key("outlook:message:<CAF-4812@mail.example.com>", "provider"));
  assert.equal(String(key), key.value);
  assert.equal(providerKey("shop", "order", 4812).value, "shop:order:4812");
});

for (const identity of [undefined, null, "", "   ", true, { id: 1 }, Number.NaN]) {
  test(`a provider key refuses the identity ${JSON.stringify(identity) ?? String(identity)}`, () => {
    assert.throws(() => providerKey("outlook", "message", identity as never), /identity/);
  });
}

test("a provider key refuses a missing provider or kind", () => {
  assert.throws(() => providerKey("", "message", "m-1"), /provider/);
  assert.throws(() => providerKey("outlook", " ", "m-1"), /kind/);
});

test("a content key is the SHA-256 of the bytes, a Buffer or a Uint8Array alike", () => {
  const expected = "sha256:" + createHash("sha256").update("test").digest("hex");
  assert.equal(contentKey(Buffer.from("test")).value, expected);
  assert.equal(contentKey(new TextEncoder().encode("test")).value, expected);
  assert.equal(contentKey(Buffer.from("test")).source, "content");
});

test("a content key refuses empty content and text", () => {
  assert.throws(() => contentKey(new Uint8Array()), /empty/);
  assert.throws(() => contentKey("test" as never), TypeError);
});

test("a file and its bytes give the same content key, streamed", async () => {
  const folder = mkdtempSync(join(tmpdir(), "startsafe-keys-"));
  const data = Buffer.alloc(200_000, "startsafe "); // several chunks of the stream
  writeFileSync(join(folder, "invoice.pdf"), data);
  assert.deepEqual(await contentKeyOfFile(join(folder, "invoice.pdf")), contentKey(data));
});

test("an empty or missing file gives no key", async () => {
  const folder = mkdtempSync(join(tmpdir(), "startsafe-keys-"));
  writeFileSync(join(folder, "empty"), "");
  await assert.rejects(contentKeyOfFile(join(folder, "empty")), /empty/);
  await assert.rejects(contentKeyOfFile(join(folder, "missing")), /ENOENT/);
});

test("an intent key joins the name and the named fields, ordered by field name", () => {
  assert.deepEqual(intentKey("campaign", { campaign_id: "2026-winter-eu" }), new Key("campaign:2026-winter-eu", "intent"));
  const one = intentKey("invoice", { period: "2026-01", customer: "c-42" });
  const two = intentKey("invoice", { customer: "c-42", period: "2026-01" });
  assert.deepEqual(one, two);
  assert.equal(one.value, "invoice:c-42:2026-01");
});

for (const fields of [{}, { campaign_id: "" }, { campaign_id: undefined }, { a: "x", b: null }]) {
  test(`an intent key refuses the fields ${JSON.stringify(fields)}`, () => {
    assert.throws(() => intentKey("campaign", fields as never), RangeError);
  });
}

test("a key is at most 255 printable characters", () => {
  assert.equal(new Key("k".repeat(255), "intent").value.length, 255);
  assert.throws(() => new Key("k".repeat(256), "intent"), /255/);
  assert.throws(() => new Key("a\nb", "intent"), /printable/);
  assert.throws(() => new Key("a\u00a0b", "intent"), /printable/); // a separator, as Python's isprintable
  assert.throws(() => new Key("k", "hash" as never), /source/);
});

test("a key rule that finds nothing refuses the call with KeyRefused, for a missing file too", async () => {
  const spec = effect({ key: (a) => intentKey("order", { id: a.id }) });
  await assert.rejects(spec.keyFor("send", { body: "no id" }), (error: unknown) => {
    assert.ok(error instanceof KeyRefused);
    assert.equal(error.tool, "send");
    assert.equal(error.code, "key_refused");
    return true;
  });
  const byFile = effect({ key: (a) => contentKeyOfFile(a.path) });
  await assert.rejects(byFile.keyFor("import", { path: "/nonexistent/file" }), KeyRefused);
  const none = effect({ key: () => null as never });
  await assert.rejects(none.keyFor("t", {}), KeyRefused);
});
