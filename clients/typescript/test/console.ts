/**
 * A person in the console, over HTTP, as a browser does it: sign in with the login form
 * (its CSRF token, then the session cookie), then POST a decision's form to the
 * effect's action address (approvals/urls.py, approvals/forms.py).
 */

import assert from "node:assert/strict";

export class Operator {
  private readonly cookies = new Map<string, string>();

  private constructor(private readonly baseUrl: string) {}

  /** Sign in at /accounts/login/ with the username and password. */
  static async signIn(baseUrl: string, username: string, password: string): Promise<Operator> {
    const operator = new Operator(baseUrl.replace(/\/+$/, ""));
    const page = await operator.send("GET", "/accounts/login/");
    const form = /name="csrfmiddlewaretoken" value="([^"]+)"/.exec(await page.text());
    assert.ok(form, "the sign-in page has a CSRF token");
    const signedIn = await operator.send("POST", "/accounts/login/", {
      username,
      password,
      next: "/",
      csrfmiddlewaretoken: form[1] as string,
    });
    assert.equal(signedIn.status, 302, `signing in as ${username} answered ${signedIn.status}`);
    assert.ok(operator.cookies.has("sessionid"), "signed in: a session cookie");
    return operator;
  }

  /** Approve the version `argsHash` of the effect, with edited arguments if given. */
  async approve(effectId: string, argsHash: string, editedArgs?: Record<string, unknown>): Promise<void> {
    const fields: Record<string, string> = { args_hash: argsHash, note: "approved from the TypeScript tests" };
    if (editedArgs) fields["args"] = JSON.stringify(editedArgs);
    await this.decide(effectId, "approve", fields);
  }

  /** Reject the version `argsHash` of the effect with a note for the model. */
  async reject(effectId: string, argsHash: string, note: string): Promise<void> {
    await this.decide(effectId, "reject", { args_hash: argsHash, note });
  }

  private async decide(effectId: string, action: string, fields: Record<string, string>): Promise<void> {
    // The CSRF cookie holds the secret, which the form field may carry as it is.
    const token = this.cookies.get("csrftoken");
    assert.ok(token, "a CSRF cookie");
    const answer = await this.send("POST", `/effects/${effectId}/${action}`, { ...fields, csrfmiddlewaretoken: token });
    assert.equal(answer.status, 303, `${action} answered ${answer.status}: ${await answer.text()}`);
  }

  private async send(method: string, path: string, form?: Record<string, string>): Promise<Response> {
    const headers: Record<string, string> = {
      Cookie: [...this.cookies].map(([name, value]) => `${name}=${value}`).join("; "),
      Referer: `${this.baseUrl}${path}`,
    };
    let body: string | undefined;
    if (form) {
      headers["Content-Type"] = "application/x-www-form-urlencoded";
      body = new URLSearchParams(form).toString();
    }
    const response = await fetch(`${this.baseUrl}${path}`, { method, headers, body, redirect: "manual" });
    for (const cookie of response.headers.getSetCookie()) {
      const [pair = ""] = cookie.split(";");
      const at = pair.indexOf("=");
      this.cookies.set(pair.slice(0, at), pair.slice(at + 1));
    }
    return response;
  }
}
