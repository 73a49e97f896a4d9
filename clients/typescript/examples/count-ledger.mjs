// Count the effects in a ledger and the duplicates among them.
//
//     node examples/count-ledger.mjs var/ledger.jsonl
//
// Exits 0 when every effect appears once, 1 when some appear more than once.

import { counts } from "./ledger.mjs";

const path = process.argv[2];
if (!path) {
  console.error("usage: node examples/count-ledger.mjs LEDGER");
  process.exit(2);
}
const counted = counts(path);
let total = 0;
let duplicates = 0;
for (const n of counted.values()) {
  total += n;
  duplicates += n - 1;
}
console.log(`effects: ${total} (${counted.size} distinct)`);
for (const [name, n] of [...counted].sort()) {
  console.log(`  ${name}  x${n}${n > 1 ? "  <- DUPLICATE" : ""}`);
}
console.log(`duplicates: ${duplicates}`);
process.exit(duplicates ? 1 : 0);
