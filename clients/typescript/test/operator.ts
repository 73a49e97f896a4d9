/**
 * A person at the console, over HTTP: signs in with the operator's password, then
 * approves (with edited arguments, if given) or rejects an effect, as the forms of
 * the effect's page post them. The live tests' operator (tests/test_typescript_client.py
 * passes the address and the credentials).
 */

export class Operator {
  private cookies = new Map<string, string>();

  private constructor(readonly baseUrl: string) {}

  /** Sign in at the console's sign-in page (Django's session and CSRF cookies). */
  static async signIn(baseUrl: string, username: string, password: string): Promise<Operator> {
    const operator = new Operator(baseUrl.replace(/\/+$/, ""));
    const page = await operator.request("GET", "/accounts/login/");
    const token = /name="csrfmiddlewaretoken" value="([^"]+)"/.exec(await page.text())?.[1];
    if (!token) throw new Error("the sign-in page has no CSRF token");
    const signedIn = await operator.request("POST", "/accounts/login/", { csrfmiddlewaretoken: token, username, password });
    if (signedIn.status !== 302 || !operator.cookies.has("sessionid")) {
      throw new Error(`the operator could not sign in (HTTP ${signedIn.status})`);
    }
    return operator;
  }

  /** Approve the version the operator saw (`argsHash`), after editing it to `editedArgs`. */
  async approve(effectId: string, argsHash: string, editedArgs?: Record<string, unknown>): Promise<void> {
    const form: Record<string, string> = { args_hash: argsHash, note: "checked at the console" };
    if (editedArgs) form["args"] = JSON.stringify(editedArgs);
    await this.decide(effectId, "approve", form);
  }

  /** Reject the effect with a note written for the model. */
  async reject(effectId: string, argsHash: string, note: string): Promise<void> {
    await this.decide(effectId, "reject", { args_hash: argsHash, note });
  }

  private async decide(effectId: string, action: string, form: Record<string, string>): Promise<void> {
    const token = this.cookies.get("csrftoken") ?? "";
    const answer = await this.request("POST", `/effects/${effectId}/${action}`, { ...form, csrfmiddlewaretoken: token });
    if (answer.status >= 400) throw new Error(`${action} refused (HTTP ${answer.status}): ${await answer.text()}`);
  }

  private async request(method: string, path: string, form?: Record<string, string>): Promise<Response> {
    const headers: Record<string, string> = {
      Cookie: [...this.cookies].map(([name, value]) => `${name}=${value}`).join("; "),
      Referer: this.baseUrl + path,
    };
    if (form) headers["Content-Type"] = "application/x-www-form-urlencoded";
    const answer = await fetch(this.baseUrl + path, {
      method,
      headers,
      body: form ? new URLSearchParams(form).toString() : null,
      redirect: "manual",
    });
    for (const cookie of answer.headers.getSetCookie()) {
      const [pair] = cookie.split(";");
      const at = pair!.indexOf("=");
      this.cookies.set(pair!.slice(0, at).trim(), pair!.slice(at + 1).trim());
    }
    return answer;
  }
}
