// A fake, seeded model for the support agent: the AI SDK's own mock model (`ai/test`)
// answering from the conversation the SDK sends it, as a model would.
//
// Like a real model, and like the Python example's FakeLLM (examples/fake_llm.py), it
// is not deterministic across attempts: seeded with (seed, attempt), each attempt
// rewrites the subject lines and wording and changes the order of its calls. "Step 3"
// is not a stable coordinate, and a key hashed from these arguments would change
// every time. What stays the same is the intent — which message is answered, which
// file is imported, which campaign is sent — and that is what the tools key on.

import { fileURLToPath } from "node:url";
import { MockLanguageModelV3 } from "ai/test";

export const DATASET = fileURLToPath(new URL("../../../examples/data/winter-eu-segment.csv", import.meta.url));

const REPLY_SUBJECTS = [
  "Re: Your winter plan question",
  "Re: Question about the winter offer",
  "About your message: the winter plan",
  "Re: winter plan — here is what we found",
];
const REPLY_OPENERS = [
  "Thanks for reaching out, {name}.",
  "Hello {name}, thank you for your patience.",
  "Hi {name}! Good question.",
  "Dear {name}, thanks for writing to us.",
];
const REPLY_BODIES = [
  "Your {plan} plan includes the winter discount; it applies at the next renewal.",
  "The winter discount is part of your {plan} plan and shows on your next invoice.",
  "Good news: on the {plan} plan the winter offer is applied automatically.",
];
const CAMPAIGN_SUBJECTS = [
  "Winter sale: 20% off for EU customers",
  "It's winter — 20% off everything",
  "Our winter offer is here",
  "20% off this winter, just for you",
];
const IMPORT_NOTES = ["segment for the winter campaign", "EU winter list", "winter-eu recipients"];
const EFFECTS = ["send_reply", "import_dataset", "send_campaign"];

/** The (fake) inbox's ticket: its inbound message id is stable across attempts. */
export function ticketFor(ticketId, dataset = DATASET) {
  return {
    ticketId,
    messageId: `<${ticketId}.inbound@mail.example.com>`, // the provider's internetMessageId
    customerEmail: "ana.silva@example.eu",
    campaignId: "2026-winter-eu",
    dataset,
  };
}

/** A small seeded generator (FNV-1a of the seed text, then mulberry32). */
function seeded(text) {
  let state = 0x811c9dc5;
  for (const char of text) state = Math.imul(state ^ char.codePointAt(0), 0x01000193) >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Every order of the three effects, as Python's itertools.permutations lists them. */
function permutations(items) {
  if (items.length <= 1) return [items];
  return items.flatMap((item, i) =>
    permutations([...items.slice(0, i), ...items.slice(i + 1)]).map((rest) => [item, ...rest]),
  );
}

const USAGE = {
  inputTokens: { total: 0, noCache: 0, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 0, text: 0, reasoning: 0 },
};

/**
 * The model of one attempt: it looks the customer up, then makes the three effects'
 * calls one per step, in an order that differs from one attempt to the next, and
 * hears each tool's output on its next turn (printed: `model hears TOOL: OUTPUT`),
 * an operator's rejection note included.
 */
export class TicketModel {
  constructor({ seed, attempt, ticket }) {
    this.ticket = ticket;
    this.attempt = attempt;
    this.random = seeded(`${seed}:${attempt}`);
    const orders = permutations(EFFECTS);
    this.plan = ["lookup_customer", ...orders[(seed * 7 + attempt) % orders.length]];
    this.customer = {};
    this.heard = [];
    this.model = new MockLanguageModelV3({ doGenerate: (options) => this.turn(options.prompt) });
  }

  pick(choices) {
    return choices[Math.floor(this.random() * choices.length)];
  }

  /** One step: hear the last tool output, then make the next planned call, or answer. */
  async turn(prompt) {
    const results = prompt
      .filter((message) => message.role === "tool")
      .flatMap((message) => message.content.filter((part) => part.type === "tool-result"));
    const last = results.at(-1);
    if (last) this.hear(last.toolName, last.output);
    if (results.length < this.plan.length) {
      const name = this.plan[results.length];
      console.log(`  model calls ${name}`);
      const call = {
        type: "tool-call",
        toolCallId: `call-${this.attempt}-${results.length}`,
        toolName: name,
        input: JSON.stringify(this.arguments(name)),
      };
      return { content: [call], finishReason: { unified: "tool-calls", raw: undefined }, usage: USAGE, warnings: [] };
    }
    const heard = this.heard.length ? ` (heard: ${this.heard.join(" | ")})` : "";
    const text = `Ticket ${this.ticket.ticketId} answered${heard}.`;
    return { content: [{ type: "text", text }], finishReason: { unified: "stop", raw: undefined }, usage: USAGE, warnings: [] };
  }

  hear(tool, output) {
    const value = output.type === "json" ? output.value : String(output.value);
    console.log(`  model hears ${tool}: ${typeof value === "string" ? value : JSON.stringify(value)}`);
    if (tool === "lookup_customer" && output.type === "json") this.customer = value;
    else if (typeof value === "string" && value.startsWith("rejected by an operator")) this.heard.push(value);
  }

  /** The arguments it generates for `tool` this time (reworded every attempt). */
  arguments(tool) {
    const { ticket, customer } = this;
    const name = customer.name ?? "there";
    switch (tool) {
      case "lookup_customer":
        return { email: ticket.customerEmail };
      case "send_reply":
        return {
          message_id: ticket.messageId,
          to: ticket.customerEmail,
          subject: this.pick(REPLY_SUBJECTS),
          body: [
            this.pick(REPLY_OPENERS).replace("{name}", name),
            this.pick(REPLY_BODIES).replace("{plan}", customer.plan ?? "current"),
            `(drafted on attempt ${this.attempt})`,
          ].join(" "),
        };
      case "import_dataset":
        return { path: ticket.dataset, table: "campaign_recipients", note: this.pick(IMPORT_NOTES) };
      case "send_campaign":
        return {
          campaign_id: ticket.campaignId,
          segment: "EU",
          subject: this.pick(CAMPAIGN_SUBJECTS),
          recipients: 240,
        };
      default:
        throw new Error(`the model knows no tool ${tool}`);
    }
  }
}
