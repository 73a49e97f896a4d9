// The ledger: a JSON-lines file standing in for the providers (mailbox, warehouse, ESP).
//
// The same file format as the Python example's ledger (examples/ledger.py), so either
// side can count it. Every side effect appends one line, fsynced, so a crash right
// after it cannot lose it and duplicates can be counted afterwards. Each line names
// the effect by the provider's own identity of it (`kind` + `identity`): the inbound
// message a reply answers, the SHA-256 of an imported dataset, the campaign id.

import { appendFileSync, closeSync, existsSync, fsyncSync, mkdirSync, openSync, readFileSync } from "node:fs";
import { dirname } from "node:path";

/** Perform an effect: append its line, flushed to disk, and return it. */
export function append(path, kind, identity, details) {
  mkdirSync(dirname(path), { recursive: true });
  const entry = { at: new Date().toISOString(), details, identity, kind, pid: process.pid };
  const fd = openSync(path, "a");
  try {
    appendFileSync(fd, JSON.stringify(entry) + "\n");
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  return entry;
}

/** Every line of the ledger, in order (an absent ledger is empty). */
export function entries(path) {
  if (!existsSync(path)) return [];
  return readFileSync(path, "utf8")
    .split("\n")
    .filter((line) => line.trim())
    .map((line) => JSON.parse(line));
}

/**
 * The first line (1-based number, entry) for this effect, or null. It reads the whole
 * file as it is now: the provider's latest state, which is what makes a "not done"
 * answer from it trustworthy.
 */
export function find(path, kind, identity) {
  const all = entries(path);
  const index = all.findIndex((e) => e.kind === kind && e.identity === identity);
  return index < 0 ? null : { line: index + 1, entry: all[index] };
}

/** How many times each effect appears, by "kind identity". */
export function counts(path) {
  const counted = new Map();
  for (const e of entries(path)) {
    const name = `${e.kind} ${e.identity}`;
    counted.set(name, (counted.get(name) ?? 0) + 1);
  }
  return counted;
}
