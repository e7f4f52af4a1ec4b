// The plugin's REST routes, called from inside Airflow's page: same origin, the UI's session
// cookie authenticates (changes add the CSRF header the routes ask for).

/** A URL of the plugin's app, relative to Airflow's <base href> (Airflow may live under a path). */
export function appUrl(path: string): string {
  return new URL(`finalckpt/${path}`, document.baseURI).toString();
}

/** A URL inside Airflow's UI (for href; navigation goes through Airflow's router). */
export function airflowUrl(path: string): string {
  return new URL(path.replace(/^\//, ""), document.baseURI).toString();
}

export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number,
    /** the 404's reason (dag / run / not_started / no_pipeline), from X-Finalckpt-Reason */
    readonly reason: string | null = null,
    /** where to log in again (a 401), from X-Finalckpt-Login */
    readonly login: string | null = null,
  ) {
    super(message);
  }

  /** Whether asking again can help (the server or the network), or only the user can. */
  get retryable(): boolean {
    return this.status === 0 || this.status >= 500 || this.reason === "not_started";
  }
}

async function answer<T>(response: Response): Promise<T> {
  const text = await response.text();
  let body: unknown = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!response.ok) {
    const detail =
      body && typeof body === "object" && "detail" in body && typeof body.detail === "string"
        ? body.detail
        : `HTTP ${response.status}`;
    throw new ApiError(
      detail,
      response.status,
      response.headers.get("X-Finalckpt-Reason"),
      response.headers.get("X-Finalckpt-Login"),
    );
  }
  return body as T;
}

export async function getJson<T>(path: string, signal?: AbortSignal): Promise<T> {
  let response: Response;
  try {
    response = await fetch(appUrl(`api/${path}`), {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
      cache: "no-store",
      signal,
    });
  } catch (err) {
    if (signal?.aborted) throw err;
    throw new ApiError(`cannot reach the Airflow API server (${String(err)})`, 0);
  }
  return answer<T>(response);
}

export async function postJson<T>(path: string, body: unknown): Promise<T> {
  let response: Response;
  try {
    response = await fetch(appUrl(`api/${path}`), {
      method: "POST",
      credentials: "same-origin",
      headers: {
        Accept: "application/json",
        "Content-Type": "application/json",
        "X-Finalckpt-Request": "1",
      },
      body: JSON.stringify(body ?? {}),
    });
  } catch (err) {
    throw new ApiError(`request failed: cannot reach the Airflow API server (${String(err)})`, 0);
  }
  return answer<T>(response);
}

export function runPath(dagId: string, runId: string): string {
  return `dags/${encodeURIComponent(dagId)}/runs/${encodeURIComponent(runId)}`;
}
