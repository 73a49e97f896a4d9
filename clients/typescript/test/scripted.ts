/**
 * A scripted `fetch` for the shared protocol vectors (clients/vectors/protocol.json):
 * each request gets the vector's next answer after the check that it is the request the
 * vector expects; the harness answers the run's own requests (start, tool declarations,
 * finish). The Python runner (tests/test_protocol_vectors.py) is the same in Python.
 */

import { readFileSync } from "node:fs";

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Json = any;

export const VECTORS: Json = JSON.parse(
  readFileSync(new URL("../../vectors/protocol.json", import.meta.url), "utf8"),
);
export const HARNESS: Json = VECTORS.harness;

export interface Sent {
  method: string;
  path: string;
  headers: Record<string, string>;
  body: Json;
}

function lowerKeys(headers: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(headers).map(([name, value]) => [name.toLowerCase(), value]));
}

function same(a: unknown, b: unknown): boolean {
  return JSON.stringify(sorted(a)) === JSON.stringify(sorted(b));
}

function sorted(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sorted);
  if (value && typeof value === "object") {
    return Object.fromEntries(
      Object.keys(value as object)
        .sort()
        .map((k) => [k, sorted((value as Record<string, unknown>)[k])]),
    );
  }
  return value;
}

export { same };

export class Script {
  steps: [Json, number][];
  readonly requests: Sent[] = [];
  readonly problems: string[] = [];

  constructor(
    steps: Json[],
    private readonly expectedRequest: Json = null,
  ) {
    this.steps = steps.map((step) => [step, step.times ?? 1]);
  }

  readonly fetch = async (input: string | URL | Request, init: RequestInit = {}): Promise<Response> => {
    const url = new URL(String(input));
    const path = url.pathname.replace(/^\/api\/v1/, "");
    const method = String(init.method ?? "GET");
    const harness = this.harnessAnswer(method, path);
    if (harness !== null) return responseOf(harness);
    const headers = lowerKeys((init.headers ?? {}) as Record<string, string>) as Record<string, string>;
    const body = typeof init.body === "string" ? JSON.parse(init.body) : null;
    this.requests.push({ method, path, headers, body });
    const next = this.steps[0];
    if (next === undefined) {
      this.problems.push(`unscripted request ${method} ${path}`);
      return new Response("unscripted", { status: 599 });
    }
    const [step, times] = next;
    this.steps = times > 1 ? [[step, times - 1], ...this.steps.slice(1)] : this.steps.slice(1);
    this.check(method, path, headers, body, step.request ?? this.expectedRequest ?? {});
    return responseOf(step.answer);
  };

  private harnessAnswer(method: string, path: string): Json {
    if (method !== "POST") return null;
    const run = HARNESS.run.answer;
    if (path === "/runs") return run;
    if (path === "/tools") return HARNESS.tools_answer;
    if (path === `/runs/${run.body.run.id}/finish`) return { status: 200, body: run.body };
    return null;
  }

  private check(method: string, path: string, headers: Record<string, string>, body: Json, expected: Json): void {
    const where = `${method} ${path}`;
    if ((expected.method ?? method) !== method || (expected.path ?? path) !== path) {
      this.problems.push(`${where}: expected ${expected.method} ${expected.path}`);
    }
    for (const [name, value] of Object.entries(lowerKeys(expected.headers ?? {}))) {
      if ((headers[name] ?? null) !== value) this.problems.push(`${where}: header ${name} ${headers[name]} != ${value}`);
    }
    for (const [name, value] of Object.entries(expected.body ?? {})) {
      if (!same(body?.[name] ?? null, value)) {
        this.problems.push(`${where}: body ${name} ${JSON.stringify(body?.[name])} != ${JSON.stringify(value)}`);
      }
    }
  }

  left(): string[] {
    return this.steps.map(([step, n]) => `${step.request?.path ?? "?"} x${n}`);
  }
}

function responseOf(answer: Json): Response {
  if (answer.network_error) {
    throw new TypeError("fetch failed", { cause: new Error("connection reset after the server answered") });
  }
  const headers = new Headers(answer.headers ?? {});
  if (answer.status === 304) return new Response(null, { status: 304, headers });
  if ("body" in answer) {
    headers.set("Content-Type", "application/json");
    return new Response(JSON.stringify(answer.body), { status: answer.status, headers });
  }
  return new Response(answer.text ?? "", { status: answer.status, headers });
}

/** A clock that moves only when the client sleeps: waits are bounded exactly. */
export class Clock {
  now = 0;
  readonly sleeps: number[] = [];
  readonly sleep = (ms: number): void => {
    this.sleeps.push(ms);
    this.now += ms;
  };
  readonly clock = (): number => this.now;
}
