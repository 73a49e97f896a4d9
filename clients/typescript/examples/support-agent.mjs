// An agent that answers a support ticket on the Vercel AI SDK, and survives being killed half-way.
//
//     npm run build
//     node examples/support-agent.mjs --base-url http://127.0.0.1:8000 \
//         --token "$STARTSAFE_TOKEN" --ticket ticket-4812 --ledger var/ledger.jsonl \
//         [--crash-after N] [--seed S] [--approval-timeout SECONDS] [--supersede]
//
// The Python example's story (examples/support_agent.py) on the AI SDK: `generateText`
// with the SDK's own mock model (`ai/test`, see fake-model.mjs) and four `tool()`s,
// journaled by `startsafe-client/ai`, each keyed from stable intent (never from what
// the model wrote):
//
// - `lookup_customer`: a read, journaled, never gated;
// - `send_reply`: keyed on the inbound message's provider id
//   (`outlook:message:<internetMessageId>`); reconciles by searching the ledger;
// - `import_dataset`: keyed on the SHA-256 of the file's content; reconciles too;
// - `send_campaign`: keyed on its campaign id, needs a person's approval (who may edit
//   its arguments), and has no lookup: when its outcome is unknown, a person decides.
//
// The seeded model rewrites the arguments and reorders the calls on every attempt.
// Side effects go to the ledger (JSON lines, ledger.mjs) so count-ledger.mjs can count
// duplicates. `--crash-after N` ends the process at once (exit 137) right after the
// N-th effect ran and before it was reported: the worst moment.
//
// Exit codes, as the Python example's: 0 answered (or already answered), 3 a person
// must decide first (see the printed addresses), 4 another attempt is live, 5 the
// restart is blocked, 137 crashed.

import { readFileSync } from "node:fs";
import { basename } from "node:path";
import { parseArgs } from "node:util";

import { generateText, stepCountIs, tool } from "ai";
import { z } from "zod";
import {
  AlreadyRunning,
  Client,
  NotPerformed,
  Reconciliation,
  RestartBlocked,
  RunFinished,
  contentKey,
  contentKeyOfFile,
  effect,
  intentKey,
  providerKey,
  read,
} from "startsafe-client";
import { NeedsPerson, journaled } from "startsafe-client/ai";

import { TicketModel, ticketFor } from "./fake-model.mjs";
import * as ledger from "./ledger.mjs";

const CRASH_EXIT = 137;
const NEEDS_PERSON_EXIT = 3;
const ALREADY_RUNNING_EXIT = 4;
const RESTART_BLOCKED_EXIT = 5;

// The fake CRM the read looks customers up in.
const CUSTOMERS = {
  "ana.silva@example.eu": { name: "Ana", plan: "team", country: "PT", since: "2023-04" },
};

/** Ends the process right after the N-th effect ran, before it is reported. */
class Crasher {
  constructor(after) {
    this.after = after;
    this.performed = 0;
  }

  effectPerformed(tool) {
    this.performed += 1;
    if (this.after !== undefined && this.performed >= this.after) {
      console.log(`!! crashing after effect ${this.performed} (${tool}), before reporting it`);
      process.exit(CRASH_EXIT); // no finally, no report: as if the machine went away
    }
  }
}

/** The SHA-256 and the row count of a CSV file; one that cannot be read was not imported. */
function readDataset(path) {
  let content;
  try {
    content = readFileSync(path);
  } catch (unreadable) {
    // Nothing has reached the warehouse yet: say so, and the next call imports it.
    throw new NotPerformed(`cannot read ${path}: ${unreadable.message}`);
  }
  // From here on an error is not proof that nothing happened: it is not reported, and
  // the next attempt looks the import up in the warehouse's log.
  const rows = content.toString("utf8").split("\n").filter((line) => line.trim()).length - 1;
  return { key: contentKey(content).value, rows };
}

/** The agent's four tools, as the AI SDK declares them: what they do, not how they are journaled. */
function declareTools(ledgerPath, crasher) {
  return {
    lookup_customer: tool({
      description: "Look a customer up in the CRM by e-mail address.",
      inputSchema: z.object({ email: z.string() }),
      execute: async ({ email }) => ({ email, ...(CUSTOMERS[email] ?? { name: "there", plan: "free" }) }),
    }),
    send_reply: tool({
      description: "Reply to the ticket's inbound e-mail.",
      inputSchema: z.object({ message_id: z.string(), to: z.string(), subject: z.string(), body: z.string() }),
      execute: async ({ message_id, to, subject, body }) => {
        ledger.append(ledgerPath, "reply", message_id, { to, subject, body });
        crasher.effectPerformed("send_reply");
        return { in_reply_to: message_id, subject };
      },
    }),
    import_dataset: tool({
      description: "Import a CSV file into a warehouse table.",
      inputSchema: z.object({ path: z.string(), table: z.string(), note: z.string().default("") }),
      execute: async ({ path, table, note }) => {
        const { key, rows } = readDataset(path);
        ledger.append(ledgerPath, "import", key, { table, rows, note });
        crasher.effectPerformed("import_dataset");
        return { sha256: key, rows, table };
      },
    }),
    send_campaign: tool({
      description: "Send an e-mail campaign to a customer segment.",
      inputSchema: z.object({
        campaign_id: z.string(),
        segment: z.string(),
        subject: z.string(),
        recipients: z.number().int(),
      }),
      execute: async ({ campaign_id, segment, subject, recipients }) => {
        ledger.append(ledgerPath, "campaign", campaign_id, { segment, subject, recipients });
        crasher.effectPerformed("send_campaign");
        return { campaign_id, subject, recipients };
      },
    }),
  };
}

/** Each tool's declaration for startsafe: its kind, key rule, approval, preview and lookup. */
function declareSpecs(ledgerPath) {
  return {
    lookup_customer: read(),
    send_reply: effect({
      key: (args) => providerKey("outlook", "message", args.message_id),
      preview: (args) => `Reply ${JSON.stringify(args.subject)} to ${args.to}`,
      // The ledger is read in full, as it is now: the provider's latest state, so
      // "not sent" is a fact, not a lagging search index.
      reconcile: (args) => {
        const found = ledger.find(ledgerPath, "reply", args.message_id);
        return found
          ? Reconciliation.done(`sent items: a reply to ${args.message_id} at line ${found.line} (${found.entry.at})`, {
              in_reply_to: args.message_id,
              ledger_line: found.line,
            })
          : Reconciliation.notDone(`sent items searched in full: no reply to ${args.message_id}`);
      },
    }),
    import_dataset: effect({
      key: (args) => contentKeyOfFile(args.path),
      preview: (args) => `Import ${basename(args.path)} into ${args.table}`,
      reconcile: (args, recorded) => {
        if (!recorded.key) return null;
        const found = ledger.find(ledgerPath, "import", recorded.key);
        return found
          ? Reconciliation.done(`warehouse: dataset ${recorded.key} imported at ledger line ${found.line}`, {
              sha256: recorded.key,
              rows: found.entry.details.rows,
              ledger_line: found.line,
            })
          : Reconciliation.notDone(`warehouse load log read in full: no import of ${recorded.key}`);
      },
    }),
    send_campaign: effect({
      key: (args) => intentKey("campaign", { campaign_id: args.campaign_id }),
      approval: "required",
      preview: (args) =>
        `Send ${JSON.stringify(args.subject)} to ${args.recipients} recipients of segment ${args.segment} ` +
        `(campaign ${args.campaign_id})`,
      // No reconcile lookup: when its outcome is unknown, a person decides.
    }),
  };
}

function parse(argv) {
  const { values } = parseArgs({
    args: argv,
    options: {
      "base-url": { type: "string", default: "http://127.0.0.1:8000" },
      token: { type: "string", default: process.env.STARTSAFE_TOKEN ?? "" },
      ticket: { type: "string", default: "ticket-4812" },
      ledger: { type: "string", default: "var/ledger.jsonl" },
      "crash-after": { type: "string" },
      seed: { type: "string", default: "1" },
      "approval-timeout": { type: "string", default: "300" },
      "poll-interval": { type: "string", default: "2" },
      "heartbeat-timeout": { type: "string", default: "15" },
      supersede: { type: "boolean", default: false },
    },
  });
  return {
    baseUrl: values["base-url"],
    token: values.token,
    ticket: values.ticket,
    ledger: values.ledger,
    crashAfter: values["crash-after"] === undefined ? undefined : Number(values["crash-after"]),
    seed: Number(values.seed),
    approvalTimeoutMs: Number(values["approval-timeout"]) * 1000,
    pollIntervalMs: Number(values["poll-interval"]) * 1000,
    heartbeatTimeout: Number(values["heartbeat-timeout"]),
    supersede: values.supersede,
  };
}

/** What a run that did not complete means to the person at the terminal, and the exit code. */
function sayWhyItStopped(stopped, ticketId) {
  if (stopped instanceof RunFinished) {
    console.log(`${ticketId} is already answered: its run is finished.`);
    return 0;
  }
  if (stopped instanceof AlreadyRunning) {
    console.log(
      `attempt ${stopped.attempt} of ${ticketId} is still running (heartbeat at ${stopped.heartbeatAt}). ` +
        "If you know that process died, run again with --supersede.",
    );
    return ALREADY_RUNNING_EXIT;
  }
  if (stopped instanceof RestartBlocked) {
    const reasons = (stopped.verdict.blocking ?? []).map((b) => b.message).join("; ");
    console.log(`restart blocked: ${reasons}. An operator may allow it in the console.`);
    return RESTART_BLOCKED_EXIT;
  }
  if (stopped instanceof NeedsPerson) {
    console.log(`${stopped.message}\nDecide in the console, then run this command again.`);
    return NEEDS_PERSON_EXIT;
  }
  throw stopped;
}

async function main(argv) {
  const options = parse(argv);
  const client = new Client({
    baseUrl: options.baseUrl,
    token: options.token,
    pollIntervalMs: options.pollIntervalMs,
    approvalTimeoutMs: options.approvalTimeoutMs,
    // Once per call that waits: say where a person decides.
    onWaiting: (waiting) => console.log(`  ${waiting.tool}: waiting (${waiting.status}) for a decision at ${waiting.url}`),
  });
  const tools = declareTools(options.ledger, new Crasher(options.crashAfter));
  const specs = declareSpecs(options.ledger);
  const ticket = ticketFor(options.ticket);
  const runOptions = {
    title: `Answer support ticket ${ticket.ticketId}`,
    input: { ticket: ticket.ticketId, message_id: ticket.messageId },
    heartbeatTimeout: options.heartbeatTimeout,
    agentVersion: `support-agent/ai-sdk (mock model, seed ${options.seed})`,
    supersede: options.supersede ? true : "stale",
  };
  try {
    await client.run(ticket.ticketId, runOptions, async (run) => {
      console.log(`run ${run.id}: attempt ${run.attempt}`);
      const journal = journaled(run, tools, specs);
      const { model } = new TicketModel({ seed: options.seed, attempt: run.attempt, ticket });
      const { text } = await generateText({
        model,
        tools: journal.tools,
        stopWhen: [stepCountIs(10), journal.stopWhen],
        system: "Answer the support ticket: look the customer up, then act.",
        prompt: `Ticket ${ticket.ticketId}`,
      });
      console.log(`  final answer: ${text}`);
      journal.throwIfUnfinished();
    });
  } catch (stopped) {
    return sayWhyItStopped(stopped, ticket.ticketId);
  }
  console.log(`${ticket.ticketId} answered: run completed.`);
  return 0;
}

process.exitCode = await main(process.argv.slice(2));
